"""Provider errors: types, fields, and the §4.6 retry classification."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from actors.llm import (
    AuthenticationError,
    ContentPolicyError,
    ContextOverflowError,
    IncompleteStreamError,
    NoRouteError,
    ProviderError,
    ProviderInternalError,
    ProviderInvalidRequestError,
    QuotaExceededError,
    RateLimitError,
    TransportError,
    UnsupportedOperationError,
    is_retryable,
)
from protocol.errors import SessionRtError

Case = tuple[Callable[[], ProviderError], str, bool]

CLASSIFICATION: list[Case] = [
    (lambda: RateLimitError("slow down"), "provider.rate-limit", True),
    (lambda: ProviderInternalError("500"), "provider.internal", True),
    (lambda: ProviderError("unrecognised"), "provider.unknown", True),
    (lambda: TransportError("reset"), "provider.transport", True),
    (lambda: TransportError("refused", delivery="not-sent"), "provider.transport", True),
    (lambda: TransportError("reset mid-body", delivery="sent"), "provider.transport", False),
    (lambda: IncompleteStreamError("no finish"), "provider.incomplete-stream", True),
    (lambda: ContextOverflowError("too long"), "provider.context-overflow", False),
    (lambda: AuthenticationError("bad key"), "provider.authentication", False),
    (lambda: QuotaExceededError("no credit"), "provider.quota-exceeded", False),
    (lambda: ContentPolicyError("refused"), "provider.content-policy", False),
    (lambda: ProviderInvalidRequestError("bad schema"), "provider.invalid-request", False),
    (lambda: UnsupportedOperationError("no images"), "provider.unsupported-operation", False),
    (lambda: NoRouteError("nobody serves it"), "provider.no-route", False),
]
IDS = [f"{type_}-{retryable}" for _, type_, retryable in CLASSIFICATION]


@pytest.mark.parametrize(("make", "type_", "retryable"), CLASSIFICATION, ids=IDS)
def test_classification_table(
    make: Callable[[], ProviderError], type_: str, retryable: bool
) -> None:
    error = make()

    assert error.type == type_
    assert error.retryable is retryable
    assert is_retryable(error) is retryable
    assert error.should_retry_override is None


@pytest.mark.parametrize(
    "make",
    [make for make, type_, _ in CLASSIFICATION if type_ != "provider.context-overflow"],
    ids=[i for i in IDS if not i.startswith("provider.context-overflow")],
)
def test_the_header_may_stop_a_retry(make: Callable[[], ProviderError]) -> None:
    error = make()
    error.should_retry_override = False

    assert error.retryable is False
    assert is_retryable(error) is False


@pytest.mark.parametrize(("make", "type_", "retryable"), CLASSIFICATION, ids=IDS)
def test_the_header_never_starts_a_retry(
    make: Callable[[], ProviderError], type_: str, retryable: bool
) -> None:
    error = make()
    error.should_retry_override = True

    assert error.retryable is retryable
    assert is_retryable(error) is retryable


def test_context_overflow_is_never_retried_whatever_the_header_says() -> None:
    error = ContextOverflowError("too long", should_retry_override=True)

    assert error.should_retry_override is True
    assert is_retryable(error) is False


@pytest.mark.parametrize("error", [ValueError("bug"), KeyboardInterrupt(), SessionRtError("x")])
def test_anything_but_a_provider_error_is_not_retried(error: BaseException) -> None:
    assert is_retryable(error) is False


def test_errors_carry_their_fields() -> None:
    rate = RateLimitError("slow down", retry_after_ms=1200, should_retry_override=False)
    internal = ProviderInternalError("overloaded", retry_after_ms=30)
    transport = TransportError("reset", delivery="sent")

    assert (rate.message, str(rate), rate.retry_after_ms) == ("slow down", "slow down", 1200)
    assert rate.should_retry_override is False
    assert RateLimitError("x").retry_after_ms is None
    assert internal.retry_after_ms == 30
    assert transport.delivery == "sent"
    assert TransportError("x").delivery == "unknown"
    assert repr(rate) == "RateLimitError('slow down')"


def test_every_provider_error_is_a_sessionrt_error() -> None:
    for make, _, _ in CLASSIFICATION:
        error = make()
        assert isinstance(error, ProviderError)
        assert isinstance(error, SessionRtError)


def test_an_unknown_delivery_is_refused() -> None:
    with pytest.raises(ValueError, match="delivery"):
        TransportError("x", delivery="maybe")  # type: ignore[arg-type]
