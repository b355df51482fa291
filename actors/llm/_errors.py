"""Typed provider failures and their retry classification (reference §4.6).

Every failure of a model call reaches the drain as a :class:`ProviderError`.
Adapters translate their transport's and API's errors here, once; the
drain never looks at HTTP statuses. Each class carries a wire ``type`` and
whether retrying the *same* request can help::

    SessionRtError
    └── ProviderError                 provider.unknown            retryable
        ├── RateLimitError            provider.rate-limit         retryable (retry_after_ms)
        ├── ProviderInternalError     provider.internal           retryable (retry_after_ms)
        ├── TransportError            provider.transport          retryable unless delivery
        │                                                         is "sent" (delivery)
        ├── IncompleteStreamError     provider.incomplete-stream  retryable
        ├── ContextOverflowError      provider.context-overflow   never (compaction handles it)
        ├── ContinuationRejectedError provider.continuation-rejected no (the step rebuilds once)
        ├── AuthenticationError       provider.authentication     no
        ├── QuotaExceededError        provider.quota-exceeded     no
        ├── ContentPolicyError        provider.content-policy     no
        ├── ProviderInvalidRequestError provider.invalid-request  no
        ├── UnsupportedOperationError provider.unsupported-operation no
        └── NoRouteError              provider.no-route           no

:class:`ProviderError` itself stands for a failure the adapter could not
classify ("UnknownProvider" in the reference), which is retryable.

``should_retry_override`` holds a provider's ``x-should-retry: true|false``
response header; adapters set it. Retry stays narrow (contract, "Retry Is
Narrow And Observable"): the header may *stop* the retry of a retryable
class (``false``), never *start* one for a class that is not retryable
(``true`` on a 401, a 400, a sent transport failure or a context overflow
changes nothing).

Whether a failure happened *before* or *after* durable output is not the
error's business: the drain knows what it has published and decides between
retry, continuation and compaction (§4.4).
"""

from __future__ import annotations

from typing import ClassVar, Final, Literal

from protocol.errors import SessionRtError

__all__ = [
    "SEND_STATES",
    "AuthenticationError",
    "ContentPolicyError",
    "ContextOverflowError",
    "ContinuationRejectedError",
    "IncompleteStreamError",
    "NoRouteError",
    "ProviderError",
    "ProviderInternalError",
    "ProviderInvalidRequestError",
    "QuotaExceededError",
    "RateLimitError",
    "SendState",
    "TransportError",
    "UnsupportedOperationError",
    "is_retryable",
]

#: How far a request got before the transport failed (``TransportError.delivery``;
#: not an inbox item's steer/queue :data:`protocol.shapes.Delivery`): ``sent``
#: means the provider may have acted on it, so replaying it could duplicate work.
SendState = Literal["unknown", "not-sent", "sent"]
SEND_STATES: Final[tuple[SendState, ...]] = ("unknown", "not-sent", "sent")


class ProviderError(SessionRtError):
    """A model call failed. Used directly for failures no subclass describes."""

    type: ClassVar[str] = "provider.unknown"
    _retryable: ClassVar[bool] = True

    def __init__(self, message: str, *, should_retry_override: bool | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.should_retry_override = should_retry_override

    @property
    def retryable(self) -> bool:
        """Whether retrying the same request may succeed.

        ``x-should-retry: false`` vetoes a retry; ``true`` cannot widen the set.
        """
        return self._retryable and self.should_retry_override is not False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


class _RetryAfterError(ProviderError):
    """A failure the provider may attach a retry-after hint to (``retry_after_ms``)."""

    def __init__(
        self,
        message: str,
        *,
        retry_after_ms: int | None = None,
        should_retry_override: bool | None = None,
    ) -> None:
        super().__init__(message, should_retry_override=should_retry_override)
        self.retry_after_ms = retry_after_ms


class RateLimitError(_RetryAfterError):
    """Too many requests; ``retry_after_ms`` is the provider's hint, if it gave one."""

    type = "provider.rate-limit"


class ProviderInternalError(_RetryAfterError):
    """The provider failed on its side (a 5xx, an overloaded model)."""

    type = "provider.internal"


class TransportError(ProviderError):
    """The connection broke; ``delivery`` says whether the request got through."""

    type = "provider.transport"

    def __init__(
        self,
        message: str,
        *,
        delivery: SendState = "unknown",
        should_retry_override: bool | None = None,
    ) -> None:
        if delivery not in SEND_STATES:
            raise ValueError(f"delivery must be one of {SEND_STATES}, not {delivery!r}")
        super().__init__(message, should_retry_override=should_retry_override)
        self.delivery: SendState = delivery

    @property
    def retryable(self) -> bool:
        return self.delivery != "sent" and self.should_retry_override is not False


class IncompleteStreamError(ProviderError):
    """The response ended without a finish (or with an unintelligible one)."""

    type = "provider.incomplete-stream"


class ContextOverflowError(ProviderError):
    """The request does not fit the model's context window."""

    type = "provider.context-overflow"
    _retryable = False


class ContinuationRejectedError(ProviderError):
    """The provider refused the history's native continuation state (a reasoning
    signature, say). The same request would fail again; the drain rebuilds the
    request once without any such state instead."""

    type = "provider.continuation-rejected"
    _retryable = False


class AuthenticationError(ProviderError):
    type = "provider.authentication"
    _retryable = False


class QuotaExceededError(ProviderError):
    type = "provider.quota-exceeded"
    _retryable = False


class ContentPolicyError(ProviderError):
    type = "provider.content-policy"
    _retryable = False


class ProviderInvalidRequestError(ProviderError):
    """The provider (or the scripted provider's script parser) rejected the request."""

    type = "provider.invalid-request"
    _retryable = False


class UnsupportedOperationError(ProviderError):
    type = "provider.unsupported-operation"
    _retryable = False


class NoRouteError(ProviderError):
    """No provider is configured for the requested model."""

    type = "provider.no-route"
    _retryable = False


def is_retryable(error: BaseException) -> bool:
    """Whether the drain may retry after ``error`` (reference §4.6).

    A :class:`ProviderError` answers for itself (:attr:`ProviderError.retryable`).
    Anything else escaping a provider is a bug, not weather, and is not retried.
    """
    return isinstance(error, ProviderError) and error.retryable
