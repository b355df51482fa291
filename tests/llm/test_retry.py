"""The retry policy (reference §4.6): classification, budget, backoff, jitter, retry-after."""

from __future__ import annotations

import math
import random

import pytest

from actors.llm import (
    AuthenticationError,
    ContextOverflowError,
    IncompleteStreamError,
    ProviderError,
    ProviderInternalError,
    RateLimitError,
    RetryPolicy,
    TransportError,
)

NO_JITTER = (1.0, 1.0)
MINUTES_15 = 15 * 60 * 1000


def exact(**fields: object) -> RetryPolicy:
    return RetryPolicy(jitter=NO_JITTER, rng=random.Random(0), **fields)  # type: ignore[arg-type]


def test_the_defaults_are_the_reference_constants() -> None:
    policy = RetryPolicy()

    assert (policy.base_ms, policy.factor, policy.max_retries) == (2000, 2, 4)
    assert (policy.jitter, policy.retry_after_cap_ms) == ((0.8, 1.2), MINUTES_15)


def test_backoff_doubles_from_two_seconds_for_four_retries() -> None:
    policy = exact()
    error = ProviderInternalError("overloaded")

    delays = [policy.decide(error, attempt) for attempt in range(1, 7)]

    assert delays == [2000, 4000, 8000, 16000, None, None]


@pytest.mark.parametrize("seed", range(20))
def test_jitter_scales_each_delay_between_0_8_and_1_2(seed: int) -> None:
    policy = RetryPolicy(rng=random.Random(seed))
    twin = random.Random(seed)
    error = RateLimitError("slow down")

    for attempt in range(1, 5):
        delay = policy.decide(error, attempt)
        backoff = 2000 * 2 ** (attempt - 1)
        assert delay == math.ceil(backoff * twin.uniform(0.8, 1.2))
        assert math.ceil(backoff * 0.8) <= delay <= math.ceil(backoff * 1.2)


def test_a_seeded_policy_decides_the_same_every_time() -> None:
    error = TransportError("reset")
    first = [RetryPolicy(rng=random.Random(7)).decide(error, a) for a in range(1, 5)]
    second = [RetryPolicy(rng=random.Random(7)).decide(error, a) for a in range(1, 5)]

    assert first == second
    assert len(set(first)) == 4


@pytest.mark.parametrize(
    "error",
    [
        AuthenticationError("bad key"),
        ContextOverflowError("too long"),
        TransportError("reset mid-body", delivery="sent"),
        RateLimitError("slow down", should_retry_override=False),
        AuthenticationError("bad key", should_retry_override=True),
        TransportError("reset mid-body", delivery="sent", should_retry_override=True),
    ],
)
def test_a_permanent_failure_is_never_retried(error: ProviderError) -> None:
    assert exact().decide(error, 1) is None


@pytest.mark.parametrize(
    "error",
    [
        IncompleteStreamError("no finish"),
        TransportError("refused", delivery="not-sent"),
        ProviderError("unrecognised"),
        RateLimitError("slow down", should_retry_override=True),
    ],
)
def test_a_retryable_failure_gets_the_backoff(error: ProviderError) -> None:
    assert exact().decide(error, 1) == 2000


def test_the_override_does_not_extend_the_budget() -> None:
    error = ProviderInternalError("busy", should_retry_override=True)

    assert exact().decide(error, 4) == 16000
    assert exact().decide(error, 5) is None


@pytest.mark.parametrize("cls", [RateLimitError, ProviderInternalError])
def test_retry_after_is_a_floor(cls: type[RateLimitError | ProviderInternalError]) -> None:
    policy = exact()

    assert policy.decide(cls("x", retry_after_ms=60_000), 1) == 60_000
    assert policy.decide(cls("x", retry_after_ms=500), 1) == 2000
    assert policy.decide(cls("x", retry_after_ms=500), 3) == 8000
    assert policy.decide(cls("x", retry_after_ms=None), 2) == 4000


def test_retry_after_floor_applies_over_the_jittered_backoff() -> None:
    policy = RetryPolicy(rng=random.Random(3))

    assert policy.decide(RateLimitError("x", retry_after_ms=2401), 1) == 2401


def test_retry_after_is_capped_at_fifteen_minutes() -> None:
    policy = exact()

    assert policy.decide(RateLimitError("x", retry_after_ms=MINUTES_15 + 1), 1) == MINUTES_15
    assert policy.decide(ProviderInternalError("x", retry_after_ms=10**12), 4) == MINUTES_15
    assert (
        exact(retry_after_cap_ms=5000).decide(RateLimitError("x", retry_after_ms=9000), 1) == 5000
    )


def test_the_cap_bounds_only_the_floor_not_the_backoff() -> None:
    policy = exact(base_ms=MINUTES_15, max_retries=2)

    assert policy.decide(RateLimitError("x", retry_after_ms=1), 2) == 2 * MINUTES_15


def test_delays_are_rounded_up_to_whole_milliseconds() -> None:
    policy = RetryPolicy(base_ms=1000, jitter=(1.0001, 1.0001), rng=random.Random(0))

    assert policy.decide(ProviderError("x"), 1) == 1001
    assert RetryPolicy(base_ms=3, factor=1.5, jitter=NO_JITTER).decide(ProviderError("x"), 2) == 5


def test_another_budget_can_be_configured() -> None:
    assert exact(max_retries=0).decide(ProviderError("x"), 1) is None
    assert exact(max_retries=1).decide(ProviderError("x"), 1) == 2000


def test_attempts_count_from_one() -> None:
    with pytest.raises(ValueError, match="attempt"):
        exact().decide(ProviderError("x"), 0)


@pytest.mark.parametrize("jitter", [(0.0, 1.0), (1.2, 0.8), (-1.0, 1.0)])
def test_an_impossible_jitter_range_is_refused(jitter: tuple[float, float]) -> None:
    with pytest.raises(ValueError, match="jitter"):
        RetryPolicy(jitter=jitter)
