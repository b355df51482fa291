"""The scripted provider's ``#fail`` directive and how a broken script is reported."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from actors.llm import (
    AuthenticationError,
    ChatMessage,
    ContentPolicyError,
    ContextOverflowError,
    Finish,
    IncompleteStreamError,
    ModelRequest,
    NoRouteError,
    ProviderError,
    ProviderInternalError,
    ProviderInvalidRequestError,
    QuotaExceededError,
    RateLimitError,
    StreamPart,
    TextChunk,
    TextContent,
    TextEnd,
    TextStart,
    ToolCall,
    TransportError,
    UnsupportedOperationError,
)
from actors.llm.scripted import PARTIAL_TEXT

MakeRequest = Callable[..., ModelRequest]
Collect = Callable[[ModelRequest], Awaitable[list[StreamPart]]]
CollectUntilError = Callable[[ModelRequest], Awaitable[tuple[list[StreamPart], ProviderError]]]

ASSISTANT_TURN = ChatMessage(role="assistant", parts=(TextContent(text="ok"),))


@pytest.mark.parametrize(
    ("kind", "cls", "type_", "retryable"),
    [
        ("rate-limit", RateLimitError, "provider.rate-limit", True),
        ("internal", ProviderInternalError, "provider.internal", True),
        ("unknown", ProviderError, "provider.unknown", True),
        ("transport", TransportError, "provider.transport", True),
        ("incomplete", IncompleteStreamError, "provider.incomplete-stream", True),
        ("context-overflow", ContextOverflowError, "provider.context-overflow", False),
        ("auth", AuthenticationError, "provider.authentication", False),
        ("quota", QuotaExceededError, "provider.quota-exceeded", False),
        ("content-policy", ContentPolicyError, "provider.content-policy", False),
        ("invalid-request", ProviderInvalidRequestError, "provider.invalid-request", False),
        ("unsupported", UnsupportedOperationError, "provider.unsupported-operation", False),
        ("no-route", NoRouteError, "provider.no-route", False),
    ],
)
async def test_each_failure_kind_raises_its_error_before_any_output(
    make_request: MakeRequest,
    collect_until_error: CollectUntilError,
    kind: str,
    cls: type[ProviderError],
    type_: str,
    retryable: bool,
) -> None:
    parts, error = await collect_until_error(make_request(f"#text never\n#fail {kind}"))

    assert parts == []
    assert type(error) is cls
    assert (error.type, error.retryable, error.should_retry_override) == (type_, retryable, None)
    assert error.message == f"Scripted {kind} failure (step 0, attempt 1)"


async def test_rate_limit_carries_its_retry_after(
    make_request: MakeRequest, collect_until_error: CollectUntilError
) -> None:
    _, error = await collect_until_error(make_request("#fail rate-limit retry-after=1500"))

    assert isinstance(error, RateLimitError)
    assert error.retry_after_ms == 1500


async def test_internal_carries_its_retry_after_and_defaults_to_none(
    make_request: MakeRequest, collect_until_error: CollectUntilError
) -> None:
    _, with_hint = await collect_until_error(make_request("#fail internal retry-after=20"))
    _, without = await collect_until_error(make_request("#fail internal"))

    assert isinstance(with_hint, ProviderInternalError)
    assert isinstance(without, ProviderInternalError)
    assert (with_hint.retry_after_ms, without.retry_after_ms) == (20, None)


@pytest.mark.parametrize(
    ("option", "delivery", "retryable"),
    [
        ("", "unknown", True),
        ("delivery=not-sent", "not-sent", True),
        ("delivery=sent", "sent", False),
    ],
)
async def test_transport_carries_its_delivery(
    make_request: MakeRequest,
    collect_until_error: CollectUntilError,
    option: str,
    delivery: str,
    retryable: bool,
) -> None:
    _, error = await collect_until_error(make_request(f"#fail transport {option}"))

    assert isinstance(error, TransportError)
    assert (error.delivery, error.retryable) == (delivery, retryable)


async def test_should_retry_sets_the_header_override(
    make_request: MakeRequest, collect_until_error: CollectUntilError
) -> None:
    _, no = await collect_until_error(make_request("#fail rate-limit should-retry=false"))
    _, yes = await collect_until_error(make_request("#fail auth should-retry=true"))

    assert (no.should_retry_override, no.retryable) == (False, False)
    assert (yes.should_retry_override, yes.retryable) == (True, False)


@pytest.mark.parametrize("option", ["attempts=1", "once"])
async def test_attempts_one_fails_only_the_first_attempt(
    make_request: MakeRequest,
    collect: Collect,
    collect_until_error: CollectUntilError,
    option: str,
) -> None:
    script = f"#fail rate-limit retry-after=10 {option}\n#text recovered"

    _, error = await collect_until_error(make_request(script))
    retried = await collect(make_request(script, metadata={"attempt": 2}))

    assert isinstance(error, RateLimitError)
    assert [p.delta for p in retried if isinstance(p, TextChunk)] == ["recovere", "d"]
    assert isinstance(retried[-1], Finish)


async def test_attempts_n_fails_the_first_n_attempts(
    make_request: MakeRequest, collect: Collect, collect_until_error: CollectUntilError
) -> None:
    script = "#fail internal attempts=3\n#text ok"

    for attempt in (1, 2, 3):
        _, error = await collect_until_error(make_request(script, metadata={"attempt": attempt}))
        assert error.message == f"Scripted internal failure (step 0, attempt {attempt})"
    parts = await collect(make_request(script, metadata={"attempt": 4}))
    assert isinstance(parts[-1], Finish)


async def test_without_attempts_every_attempt_fails(
    make_request: MakeRequest, collect_until_error: CollectUntilError
) -> None:
    _, error = await collect_until_error(make_request("#fail auth", metadata={"attempt": 99}))

    assert isinstance(error, AuthenticationError)


async def test_incomplete_after_output_streams_the_step_and_raises_instead_of_finishing(
    make_request: MakeRequest, collect_until_error: CollectUntilError
) -> None:
    script = "#text partial answer\n#tool read {}\n#fail incomplete after-output"
    parts, error = await collect_until_error(make_request(script))

    assert isinstance(error, IncompleteStreamError)
    assert parts[0] == TextStart(ordinal=0)
    assert any(isinstance(p, ToolCall) for p in parts)
    assert not any(isinstance(p, Finish) for p in parts)


async def test_after_output_with_nothing_to_stream_streams_a_partial_text(
    make_request: MakeRequest, collect_until_error: CollectUntilError
) -> None:
    parts, error = await collect_until_error(make_request("#fail transport after-output once"))

    assert isinstance(error, TransportError)
    assert "".join(p.delta for p in parts if isinstance(p, TextChunk)) == PARTIAL_TEXT
    assert parts[-1] == TextEnd(ordinal=0)


async def test_a_failure_belongs_to_its_step(
    make_request: MakeRequest, collect: Collect, collect_until_error: CollectUntilError
) -> None:
    script = "#tool read {}\n---\n#fail context-overflow"
    first = await collect(make_request(script))
    _, error = await collect_until_error(make_request(script, ASSISTANT_TURN))

    assert isinstance(first[-1], Finish)
    assert isinstance(error, ContextOverflowError)
    assert error.message == "Scripted context-overflow failure (step 1, attempt 1)"


# -- a broken script ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ("#fail", "line 1: #fail expects one of rate-limit"),
        ("#fail explode", "line 1: #fail expects one of"),
        ("#fail auth retry-after=5", "line 1: #fail auth: unknown option 'retry-after=5'"),
        ("#fail transport delivery=maybe", "line 1: delivery expects unknown|not-sent|sent"),
        ("#fail auth attempts=0", "line 1: attempts expects an integer >= 1"),
        ("#text a\n#fail auth\n#fail internal", "line 3: a step has at most one #fail"),
        ("#finish later", "line 1: #finish expects one of stop, tool-calls"),
        ("#text a\n#finish stop\n#finish length", "line 3: a step has at most one #finish"),
        ("#tool", "line 1: #tool needs a name"),
        ("#tool read {oops", "line 1: #tool read: input is not JSON"),
        ('#tool read ["a"]', "line 1: #tool read: input must be a JSON object"),
        ("#delay soon", "line 1: #delay expects an integer >= 0"),
        ("#chunk 0", "line 1: #chunk expects an integer >= 1"),
        ("#usage", "line 1: #usage needs at least one"),
        ("#usage tokens=5", "line 1: #usage expects input|output"),
        ("#usage cost=-1", "line 1: #usage cost expects a number >= 0"),
        ("#usage input=1.5", "line 1: #usage input expects an integer >= 0"),
        ("#step now", "line 1: #step takes no argument"),
        ("#text a\n---\n\n---\n#text b", "line 2: empty step"),
    ],
)
async def test_a_malformed_prompt_script_is_an_invalid_request(
    make_request: MakeRequest, collect: Collect, script: str, message: str
) -> None:
    with pytest.raises(ProviderInvalidRequestError) as caught:
        await collect(make_request("Some prose first.\n" + script))

    # The prose line shifts every line number by one.
    line, _, rest = message.partition(":")
    shifted = f"line {int(line.split()[1]) + 1}:{rest}"
    assert caught.value.message.startswith(f"Invalid script: {shifted}")
    assert not caught.value.retryable


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ("#text a\nplain prose", "line 2: not a directive or comment: 'plain prose'"),
        ("#text a\n#texts b", "line 2: unknown directive: '#texts b'"),
    ],
)
async def test_a_configured_script_admits_only_directives_comments_and_blanks(
    make_request: MakeRequest, collect: Collect, script: str, message: str
) -> None:
    with pytest.raises(ProviderInvalidRequestError, match=f"^Invalid script: {message}$"):
        await collect(make_request("hi", metadata={"script": script}))
