"""The built-in scripted provider: deterministic model answers, no key, no network.

The answer depends on the request alone (no clock, no randomness, no state
between calls), so a step replayed after a crash or a retry streams the same
parts again. Tests and demos steer it with a *script*.

Where the script comes from, first match wins:

1. ``request.metadata["script"]``: a configured script (the agent's or the
   session's), a string in which every line is a directive, a comment
   (``#`` followed by a space, or ``#`` alone) or blank;
2. the text of the **last** user message, if it holds at least one
   directive; every other line of it is prose and ignored, including
   ``#words`` that are not keywords;
3. otherwise no script: the default reply (below).

Syntax. A directive is a line (leading and trailing blanks are dropped) made
of ``#``, a keyword, and its argument after one space::

    #text <text>           a text block; consecutive #text lines (prose
                           between them aside) form one block, joined by
                           newlines; "#text" alone adds an empty line. The
                           argument is kept verbatim after the one
                           separating space, trailing blanks dropped.
    #reasoning <text>      a reasoning block, joined the same way
    #tool <name> [<json>]  a tool call; <json> is a JSON object on the same
                           line (default {}). Several per step are allowed.
    #hosted <name> [<json>]  a hosted call: the provider "executes" it (like
                           Anthropic's web search); the runtime records it
                           and never runs it. Without a #hosted-result it
                           fails with tool.result-missing
    #hosted-result [error] [<json>]  the result of the latest #hosted call,
                           a JSON object (default {}) given back as the
                           provider's result block; "error" marks it failed
    #delay <ms>            sleep <ms> before every chunk streamed after this
                           line, for the rest of the step (default 0)
    #chunk <n>             stream text, reasoning and tool input in pieces of
                           <n> characters from here on (default 8)
    #finish <reason>       stop | tool-calls | length | content-filter |
                           other | unknown; default "tool-calls" when the
                           step calls a tool, else "stop"
    #usage <key>=<n> ...   override the reported usage: input, output,
                           reasoning, cache-read, cache-write (integers),
                           cost (a number); keys left out keep their derived
                           values
    #fail <kind> [opts]    fail this step instead of finishing it
    #summary <text>        the summary a compaction request answers with
                           (consecutive lines form one block; the last
                           block found wins); a model step ignores it
    #summary-delay <ms>    sleep <ms> before each summary chunk
    #summary-fail <kind> [opts]  fail the compaction request as #fail would
                           (``attempts=<n>``/``once`` count the requests of
                           one compaction)
    #step  or  ---         end the current step and begin the next; a
                           "---" line counts even amid a prompt's prose
                           (once the prompt holds any directive)

``#fail`` kinds and the error raised: ``rate-limit`` (RateLimitError),
``internal`` (ProviderInternalError), ``unknown`` (ProviderError),
``transport`` (TransportError), ``incomplete`` (IncompleteStreamError),
``context-overflow``, ``auth``, ``quota``, ``content-policy``,
``invalid-request``, ``unsupported``, ``no-route``. Options:

- ``retry-after=<ms>`` (rate-limit and internal only) sets ``retry_after_ms``;
- ``delivery=unknown|not-sent|sent`` (transport only, default unknown);
- ``should-retry=true|false`` sets ``should_retry_override`` (the header, which
  may stop a retry but never start one);
- ``attempts=<n>`` fails only physical attempts 1..n of the step, read from
  ``request.metadata["attempt"]`` (default 1), so a retry succeeds;
  ``once`` means ``attempts=1``. Without either, every attempt fails;
- ``after-output`` streams the step's blocks first and raises instead of
  the finish; a step with nothing to stream streams :data:`PARTIAL_TEXT`.
  Without it the error is raised before any part.

A step holds at most one ``#fail`` and one ``#finish``. Empty steps before
the first or after the last directive are dropped; an empty step between two
separators is an error. A malformed script (or a non-string
``metadata["script"]``) makes the stream raise
:class:`~actors.llm.ProviderInvalidRequestError` naming the line.

Step selection. The step run is number *k* (from 0), the count of assistant
messages after the last user message, not counting the max-steps directive:
each continuation of a tool loop reloads the history with one more assistant
message, so it runs the next step. When the script has no step *k*, the
answer is :data:`SCRIPT_DONE_TEXT` with finish ``stop``.

Streaming. A step streams its blocks in the order the directives are
written. Text and reasoning blocks share ordinals 0, 1, ...; each tool call
streams ``ToolInputStart``, ``ToolInputChunk`` pieces of its compact JSON
input, ``ToolInputEnd`` and ``ToolCall``, with id ``call_<k>_<n>`` (*n* from 0
within the step). Then exactly one ``Finish``.

Tools off. When ``request.tool_choice == "none"`` or
``request.max_steps_reached``, ``#tool`` directives are skipped, a
``tool-calls`` finish becomes ``stop``, and a step left with no text block
streams :data:`TOOLS_OFF_TEXT`. Tool names are never checked against
``request.tools``: a script may call an unknown tool on purpose.

Default reply. Without a script: ``Scripted reply: <the first 80 characters
of the last user text, whitespace collapsed>`` (``Scripted reply.`` when there
is no user text), finish ``stop``.

Usage. Derived at about four characters per token, rounded up: ``input`` from
the system prompts and message texts, tool inputs and tool outputs (files not
counted), ``output`` from the streamed text and tool input, ``reasoning``
from the streamed reasoning; cache 0, cost 0. ``#usage`` overrides.

Compaction requests (``request.metadata["purpose"] == "compaction"``)
answer with a summary instead of a step: the ``#summary`` text found in the
configured script or, failing that, in any user message of the request (the
serialized conversation being summarized), else a default checkpoint with the
headings ``## Objective``, ``## Work State`` and ``## Next Move`` naming the
first user line. It streams in :data:`DEFAULT_CHUNK` pieces, finish ``stop``.
A context overflow is ``#fail context-overflow`` (``once`` lets the step
rebuilt after the overflow-triggered compaction succeed).

Example (a prompt that reads a file, then answers; the first attempt of the
first step is rate limited)::

    Please look at the README.
    #fail rate-limit retry-after=10 once
    #text Let me read it.
    #tool read {"path": "README.md"}
    #tool list {"path": "."}
    ---
    #delay 5
    #text The README describes sessionrt.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Sequence
from typing import Any, Final

import attrs

from actors.llm._errors import ProviderError, ProviderInvalidRequestError
from actors.llm._request import (
    ChatMessage,
    HostedContent,
    ModelRequest,
    ReasoningContent,
    TextContent,
    ToolCallContent,
    ToolResultContent,
)
from actors.llm._script import (
    DEFAULT_CHUNK,
    Block,
    Failure,
    HostedResultBlock,
    Script,
    ScriptError,
    Step,
    TextBlock,
    ToolBlock,
    find_script,
    find_summary,
    parse_script,
)
from actors.llm._stream import (
    Finish,
    FinishReason,
    HostedResult,
    ReasoningChunk,
    ReasoningEnd,
    ReasoningStart,
    StreamPart,
    TextChunk,
    TextEnd,
    TextStart,
    ToolCall,
    ToolInputChunk,
    ToolInputEnd,
    ToolInputStart,
    Usage,
)
from actors.llm.max_steps import is_max_steps_message
from protocol import codec
from protocol.lru import ByteLRU, reused_prefix
from protocol.untrack import untracked_tuple

__all__ = [
    "PARTIAL_TEXT",
    "SCRIPT_DONE_TEXT",
    "TOOLS_OFF_TEXT",
    "ScriptedProvider",
    "step_index",
]

SCRIPT_DONE_TEXT: Final = "Scripted run complete."
TOOLS_OFF_TEXT: Final = "Tools are disabled for this step; answering with text only."
PARTIAL_TEXT: Final = "Partial scripted output."
_REPLY_CHARS: Final = 80
_CHARS_PER_TOKEN: Final = 4


@attrs.frozen(kw_only=True)
class ScriptedProvider:
    """The scripted model; see the module documentation for the script language.

    ``sleep`` is how ``#delay`` waits (seconds); tests may pass a recording
    fake instead of :func:`asyncio.sleep` to observe the pacing without time.
    """

    sleep: Callable[[float], Awaitable[None]] = attrs.field(default=asyncio.sleep, repr=False)

    async def stream(self, request: ModelRequest) -> AsyncGenerator[StreamPart, None]:
        """Stream the scripted answer to ``request`` (a :class:`~actors.llm.Provider`)."""
        attempt = _attempt(request)
        if request.metadata.get("purpose") == "compaction":
            async for part in self._summary(request):
                yield part
            return
        k = step_index(request.messages)
        step = _select_step(request, k)
        failure = step.failure if step.failure and step.failure.applies(attempt) else None
        if failure is not None and not failure.after_output:
            raise _error(failure, k, attempt)

        tools_on = request.tool_choice == "auto" and not request.max_steps_reached
        blocks = [b for b in step.blocks if tools_on or isinstance(b, TextBlock)]
        if len(blocks) < len(step.blocks) and not _has_text(blocks):
            blocks.append(TextBlock(kind="text", text=TOOLS_OFF_TEXT))
        if failure is not None and not blocks:
            blocks.append(TextBlock(kind="text", text=PARTIAL_TEXT))

        for delay_ms, part in _parts(blocks, k):
            if delay_ms:
                # A real sleep per chunk: cancelling the consumer interrupts it here.
                await self.sleep(delay_ms / 1000)
            yield part
        if failure is not None:
            raise _error(failure, k, attempt)

        called = any(isinstance(b, ToolBlock) and not b.hosted for b in blocks)
        reason: FinishReason = step.finish or ("tool-calls" if called else "stop")
        if reason == "tool-calls" and not tools_on:
            reason = "stop"
        overrides: dict[str, Any] = dict(step.usage)
        usage = attrs.evolve(_derived_usage(request, blocks), **overrides)
        yield Finish(reason=reason, usage=usage)

    async def _summary(self, request: ModelRequest) -> AsyncGenerator[StreamPart, None]:
        configured = request.metadata.get("script")
        try:
            found = find_summary(configured if isinstance(configured, str) else "")
            if found.text is None and found.failure is None:
                for message in reversed(request.messages):
                    if message.role == "user":
                        found = find_summary(message.text)
                        if found.text is not None or found.failure is not None:
                            break
        except ScriptError as exc:
            raise ProviderInvalidRequestError(f"Invalid script: {exc}") from None
        attempt = _attempt(request)
        failure = found.failure
        if failure is not None and failure.applies(attempt):
            raise failure.error(f"Scripted {failure.kind} failure (summary, attempt {attempt})")
        text = found.text if found.text is not None else _default_summary(request)
        yield TextStart(ordinal=0)
        for piece in _chunks(text, DEFAULT_CHUNK):
            if found.delay_ms:
                await self.sleep(found.delay_ms / 1000)
            yield TextChunk(ordinal=0, delta=piece)
        yield TextEnd(ordinal=0)
        usage = _derived_usage(request, [TextBlock(kind="text", text=text)])
        yield Finish(reason="stop", usage=usage)


def _default_summary(request: ModelRequest) -> str:
    """A checkpoint naming the first user line of the conversation summarized."""
    lines = "\n".join(m.text for m in request.messages if m.role == "user").splitlines()
    first = next(
        (
            lines[i + 1].strip()
            for i, line in enumerate(lines[:-1])
            if line.strip() == "[user]" and lines[i + 1].strip()
        ),
        "",
    )
    objective = " ".join(first.split())[:_REPLY_CHARS]
    return (
        f"## Objective\n{objective or 'Continue the session.'}\n"
        "## Work State\n### Completed\nThe earlier conversation, summarized.\n"
        "## Next Move\nContinue with the latest request."
    )


def step_index(messages: Sequence[ChatMessage]) -> int:
    """Assistant messages after the last user message, the max-steps directive aside.

    Walks back from the end only as far as that user message: a scan of the
    whole request made the scripted model's cost grow with the history.
    """
    count = 0
    for m in reversed(messages):
        if m.role == "user":
            break
        if m.role == "assistant" and not is_max_steps_message(m):
            count += 1
    return count


def _attempt(request: ModelRequest) -> int:
    attempt = request.metadata.get("attempt", 1)
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise ProviderInvalidRequestError(
            f"metadata 'attempt' must be an integer >= 1, not {attempt!r}"
        )
    return attempt


def _error(failure: Failure, k: int, attempt: int) -> ProviderError:
    return failure.error(f"Scripted {failure.kind} failure (step {k}, attempt {attempt})")


def _select_step(request: ModelRequest, k: int) -> Step:
    script = _script(request)
    if script is None:
        return Step(blocks=(TextBlock(kind="text", text=_default_reply(request)),))
    if k < len(script.steps):
        return script.steps[k]
    return Step(blocks=(TextBlock(kind="text", text=SCRIPT_DONE_TEXT),))


def _script(request: ModelRequest) -> Script | None:
    configured = request.metadata.get("script")
    try:
        if configured is not None and not isinstance(configured, str):
            raise ProviderInvalidRequestError(
                f"metadata 'script' must be a string, not {type(configured).__name__}"
            )
        if configured:
            return parse_script(configured)
        return find_script(_last_user_text(request.messages))
    except ScriptError as exc:
        raise ProviderInvalidRequestError(f"Invalid script: {exc}") from None


def _last_user_text(messages: Sequence[ChatMessage]) -> str:
    return next((m.text for m in reversed(messages) if m.role == "user"), "")


def _default_reply(request: ModelRequest) -> str:
    text = " ".join(_last_user_text(request.messages).split())
    return f"Scripted reply: {text[:_REPLY_CHARS]}" if text else "Scripted reply."


def _has_text(blocks: Sequence[Block]) -> bool:
    return any(isinstance(b, TextBlock) and b.kind == "text" for b in blocks)


def _parts(blocks: Sequence[Block], k: int) -> Iterator[tuple[int, StreamPart]]:
    """The step's parts, each with the delay to wait before it.

    A plain generator, so the async one above owns the only suspension point
    and closing it leaves nothing half-run behind.
    """
    ordinal = calls = 0
    hosted = ""
    for block in blocks:
        if isinstance(block, HostedResultBlock):
            yield 0, HostedResult(id=hosted, content=block.content, error=block.error)
        elif isinstance(block, ToolBlock):
            call_id = f"{'srvtoolu' if block.hosted else 'call'}_{k}_{calls}"
            calls += 1
            if block.hosted:
                hosted = call_id
            yield 0, ToolInputStart(id=call_id, name=block.name)
            for piece in _chunks(_json(block.input), block.chunk):
                yield block.delay_ms, ToolInputChunk(id=call_id, delta=piece)
            yield 0, ToolInputEnd(id=call_id)
            yield 0, ToolCall(id=call_id, name=block.name, input=block.input, hosted=block.hosted)
        elif block.kind == "text":
            yield 0, TextStart(ordinal=ordinal)
            for piece in _chunks(block.text, block.chunk):
                yield block.delay_ms, TextChunk(ordinal=ordinal, delta=piece)
            yield 0, TextEnd(ordinal=ordinal)
            ordinal += 1
        else:
            yield 0, ReasoningStart(ordinal=ordinal)
            for piece in _chunks(block.text, block.chunk):
                yield block.delay_ms, ReasoningChunk(ordinal=ordinal, delta=piece)
            yield 0, ReasoningEnd(ordinal=ordinal)
            ordinal += 1


def _chunks(text: str, size: int) -> Iterator[str]:
    for start in range(0, len(text), size):
        yield text[start : start + size]


def _json(value: object) -> str:
    return codec.dumps(value).decode()


def _tokens(chars: int) -> int:
    return math.ceil(chars / _CHARS_PER_TOKEN)


#: Characters each request message was counted at, by identity (the runtime
#: hands the same message objects back step after step), bounded by the text
#: bytes the entries keep alive.
_SEEN: Final[ByteLRU[int, tuple[ChatMessage, int]]] = ByteLRU(16 * 1024 * 1024)


def _chars(message: ChatMessage) -> int:
    entry = _SEEN.get(id(message))
    if entry is not None and entry[0] is message:
        return entry[1]
    chars = 0
    for part in message.parts:
        if isinstance(part, TextContent | ReasoningContent | HostedContent):
            chars += len(part.text)
        elif isinstance(part, ToolCallContent):
            chars += len(part.name) + len(_json(part.input))
        elif isinstance(part, ToolResultContent):
            chars += len(part.output)
    _SEEN.put(id(message), (message, chars), chars)
    return chars


#: By session: the last request's messages and their running character counts,
#: so the next request (the same messages and a few more) counts only its tail.
#: Bounded by 16 bytes a message (a reference and a count; the messages are the
#: runtime's own objects).
_COUNTED: Final[ByteLRU[str, tuple[tuple[ChatMessage, ...], tuple[int, ...]]]] = ByteLRU(
    4096 * 1024
)


def _request_chars(request: ModelRequest) -> int:
    messages = request.messages
    last = _COUNTED.get(request.session_id)
    keep = 0 if last is None else reused_prefix(messages, last[0])
    sums = list(last[1][: keep + 1]) if last is not None and keep else [0]
    for message in messages[keep:]:
        sums.append(sums[-1] + _chars(message))
    counted = untracked_tuple(sums)  # ints: no walk of them when the entry is kept
    _COUNTED.put(request.session_id, (tuple(messages), counted), 16 * len(sums))
    return sums[-1]


def _derived_usage(request: ModelRequest, blocks: Sequence[Block]) -> Usage:
    seen = sum(map(len, request.system)) + _request_chars(request)
    output = reasoning = 0
    for block in blocks:
        if isinstance(block, HostedResultBlock):
            continue
        if isinstance(block, ToolBlock):
            output += len(_json(block.input))
        elif block.kind == "text":
            output += len(block.text)
        else:
            reasoning += len(block.text)
    return Usage(input=_tokens(seen), output=_tokens(output), reasoning=_tokens(reasoning))
