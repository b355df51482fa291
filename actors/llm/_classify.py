"""From a provider's failure answer to a typed :class:`~actors.llm.ProviderError`.

Both formats put the same facts in different places: the HTTP status, an
error ``type`` (Anthropic: ``rate_limit_error``, ``overloaded_error``, …;
OpenAI: ``invalid_request_error``, …), an error ``code`` (OpenAI:
``context_length_exceeded``, ``insufficient_quota``, …) and a message. The
adapters pull those out of their body or in-stream event; :func:`classify`
decides, in this order (the first that matches wins):

    context overflow   code context_length_exceeded, or a 400/413 whose
                       message says the prompt is too long / exceeds the context
    continuation       a 400 refusing replayed native state: an invalid
      rejected         ``signature`` of a thinking/reasoning block
    quota              code/type insufficient_quota or billing_error, 402, or
                       Anthropic's "credit balance is too low" (a 400)
    content policy     code content_filter / content_policy_violation
    provider internal  type overloaded_error / api_error / server_error, or a
                       5xx (529 included; an in-stream error's numeric code
                       counts as its status)
    rate limit         type rate_limit_error, or 429
    authentication     401/403, type authentication_error / permission_error
    retryable unknown  408, 409
    invalid request    any other 4xx, type invalid_request_error / not_found_error
    unknown            anything else (retryable, as the reference says)

``x-should-retry: false`` vetoes a retryable class's retry (``true`` never
widens it); ``retry-after-ms``/``retry-after`` become ``retry_after_ms``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from actors.llm._errors import (
    AuthenticationError,
    ContentPolicyError,
    ContextOverflowError,
    ContinuationRejectedError,
    ProviderError,
    ProviderInternalError,
    ProviderInvalidRequestError,
    QuotaExceededError,
    RateLimitError,
)
from actors.llm._http import retry_after_ms, should_retry

__all__ = ["classify"]

_OVERFLOW_TEXTS: Final = (
    "prompt is too long",
    "context_length_exceeded",
    "maximum context length",
    "context length",
    "context window",
    "too many tokens",
)


_INTERNAL_TYPES: Final = ("overloaded_error", "api_error", "server_error")


def classify(
    *,
    provider: str,
    status: int | None,
    headers: Mapping[str, str],
    etype: str | None,
    code: str | None,
    message: str,
) -> ProviderError:
    """The typed error for one failure answer (``status`` None: an in-stream error)."""
    if status is None and code is not None and code.isdigit():
        # OpenAI-compatible servers put the HTTP status in an in-stream error's code.
        status = int(code)
        code = None
    override = should_retry(headers)
    after = retry_after_ms(headers)
    where = f"HTTP {status}" if status is not None else "in-stream error"
    detail = " ".join(s for s in (etype or code, message) if s) or "no details"
    text = f"provider {provider!r} failed ({where}): {detail}"
    lowered = message.lower()
    if code == "context_length_exceeded" or (
        status in (None, 400, 413) and any(t in lowered for t in _OVERFLOW_TEXTS)
    ):
        return ContextOverflowError(text)
    if (
        status in (None, 400)
        and "signature" in lowered
        and ("thinking" in lowered or "reasoning" in lowered)
    ):
        return ContinuationRejectedError(text)
    if (
        "insufficient_quota" in (code, etype)
        or etype == "billing_error"
        or status == 402
        or "credit balance is too low" in lowered  # Anthropic answers this with a 400
    ):
        return QuotaExceededError(text, should_retry_override=override)
    if code in ("content_filter", "content_policy_violation"):
        return ContentPolicyError(text, should_retry_override=override)
    if etype in _INTERNAL_TYPES or (status is not None and status >= 500):
        return ProviderInternalError(text, retry_after_ms=after, should_retry_override=override)
    if etype == "rate_limit_error" or status == 429:
        return RateLimitError(text, retry_after_ms=after, should_retry_override=override)
    if status in (401, 403) or etype in ("authentication_error", "permission_error"):
        return AuthenticationError(text, should_retry_override=override)
    if status in (408, 409):
        return ProviderError(text, should_retry_override=override)
    if (status is not None and 400 <= status < 500) or etype in (
        "invalid_request_error",
        "not_found_error",
        "request_too_large",
    ):
        return ProviderInvalidRequestError(text, should_retry_override=override)
    return ProviderError(text, should_retry_override=override)
