"""When to try a failed model call again, and after how long (reference §4.6).

:class:`RetryPolicy` is pure: it neither sleeps nor reads a clock, and its
only source of variation is the injected :class:`random.Random`, so a seeded
generator makes every decision reproducible. The drain creates one policy
per logical step, asks :meth:`RetryPolicy.decide` after each failed attempt,
publishes ``session.retry.scheduled`` with ``at = now + delay`` from its own
clock, and sleeps until then.

The schedule, for the attempt that just failed (1 = the first try)::

    backoff  = base_ms * factor ** (attempt - 1) * U(jitter)    2 s, 4 s, 8 s, 16 s
    floor    = min(retry_after_ms, retry_after_cap_ms)          rate-limit/internal only
    delay    = ceil(max(backoff, floor))                        whole milliseconds

and no retry once ``max_retries`` retries have been spent (by default the
first try plus four retries: five attempts in all), nor for an error that
:func:`~actors.llm.is_retryable` calls permanent.
"""

from __future__ import annotations

import math
import random

import attrs

from actors.llm._errors import ProviderError, ProviderInternalError, RateLimitError, is_retryable

__all__ = ["RetryPolicy"]


def _check_jitter(_instance: object, _attribute: object, value: tuple[float, float]) -> None:
    low, high = value
    if not 0 < low <= high:
        raise ValueError(f"jitter must satisfy 0 < low <= high, not {value!r}")


@attrs.frozen(kw_only=True)
class RetryPolicy:
    """Exponential backoff with jitter, a retry budget and a retry-after floor."""

    base_ms: int = attrs.field(default=2000, validator=attrs.validators.gt(0))
    factor: float = attrs.field(default=2, validator=attrs.validators.ge(1))
    max_retries: int = attrs.field(default=4, validator=attrs.validators.ge(0))
    jitter: tuple[float, float] = attrs.field(default=(0.8, 1.2), validator=_check_jitter)
    retry_after_cap_ms: int = attrs.field(default=15 * 60 * 1000, validator=attrs.validators.ge(0))
    rng: random.Random = attrs.field(factory=random.Random, eq=False, repr=False)

    def decide(self, error: ProviderError, attempt: int) -> int | None:
        """The delay in whole ms before retrying after ``attempt`` failed with ``error``.

        ``None`` means give up: the error is not retryable, or the retries are
        spent (``attempt > max_retries``). ``attempt`` counts from 1.
        """
        if attempt < 1:
            raise ValueError(f"attempt counts from 1, not {attempt}")
        if not is_retryable(error) or attempt > self.max_retries:
            return None
        delay = self.base_ms * self.factor ** (attempt - 1) * self.rng.uniform(*self.jitter)
        retry_after = (
            error.retry_after_ms
            if isinstance(error, RateLimitError | ProviderInternalError)
            else None
        )
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.retry_after_cap_ms))
        return math.ceil(delay)
