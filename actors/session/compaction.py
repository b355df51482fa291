"""Compaction: the estimate before each step, the rolling summary, the recent tail.

Before each step the drain asks :meth:`Compactor.due` whether the complete
model-visible request fits the selected model's window (reference §4.8):

    output  = min(limits.output, 32000)
    ceiling = limits.context - max(output, buffer)
              (limits.context - output when that leaves nothing)
    due     = auto and limits known and estimate >= ceiling
              and the last message is not a completed compaction
              and older history exists to summarize

The estimate anchors on the newest successful assistant message that reported
tokens (its input + cache + output + reasoning: what the provider counted) and
adds about four characters per token for everything after it, its own tool
results included; without an anchor it counts the system prompt, the tool
definitions and every message. Per-message estimates are cached by the
identity of the decoded message (the store hands back the same object for an
unchanged row), so a step costs the messages since the anchor, not the whole
history. No tokenizer is involved.

A compaction keeps a bounded recent tail verbatim (newest first until
``tail_tokens``, the newest always kept, then forward to the next user
message so tool calls stay with their results and the budget holds; when
everything fits, only the latest exchange), asks the session's model for a
structured summary of everything before it (an "update the checkpoint"
request when an earlier summary is there), and records
``session.compaction.ended`` with the summary and the serialized tail.
Summary deltas go out live (``session.compaction.delta``) and are never
stored. The requests of one compaction share one retry budget.
After it, the active history is the compaction (summary and tail as plain
text, :func:`render`) plus what follows; no provider continuation state
crosses it.

A compaction a crash or restart cut off is found still ``running`` when the
session's next drain starts (:meth:`Compactor.settle`): it fails
(``compaction.interrupted``). An automatic one needs nothing more (the next
step's estimate asks again). A manual one was asked for, and its control
item is consumed: it is delivered again once, in the same command as the
failure (``compaction.started`` under :func:`recovered_id`), and runs
before anything else; cut off a second time, it only fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import operator
from collections.abc import Callable, Sequence
from typing import Final

import attrs
import orjson

from actors.event_bus import EventBus
from actors.kit import finish
from actors.llm import (
    ChatMessage,
    Finish,
    ModelLimits,
    ModelRequest,
    ProviderError,
    ProviderRegistry,
    RetryPolicy,
    TextChunk,
    TextContent,
    Usage,
)
from actors.session.step import step_tokens
from protocol import events as ev
from protocol.shapes import (
    AssistantMessage,
    CompactionMessage,
    ModelRef,
    ReasoningPart,
    SessionMessage,
    ShellMessage,
    SyntheticMessage,
    SystemMessage,
    TextPart,
    ToolPart,
    UserMessage,
)
from storage import Command, Store
from storage.clock import SYSTEM, Clock

__all__ = [
    "BUFFER_TOKENS",
    "HEADINGS",
    "OUTPUT_TOKEN_MAX",
    "TAIL_TOKENS",
    "CompactionSettings",
    "Compactor",
    "Estimator",
    "recovered_id",
    "render",
    "select_tail",
    "serialize",
]

#: The suffix of the id a manual compaction cut off by a crash runs again under.
RECOVERED_SUFFIX: Final = "-recovered"


def recovered_id(input_id: str) -> str | None:
    """The id manual compaction ``input_id`` runs again under after a crash;
    None when it already is such a second run (it is recovered once)."""
    if input_id.endswith(RECOVERED_SUFFIX):
        return None
    body = input_id.removeprefix("msg_")[: 100 - len(RECOVERED_SUFFIX)]
    return f"msg_{body}{RECOVERED_SUFFIX}"


log = logging.getLogger(__name__)

BUFFER_TOKENS: Final = 20_000
TAIL_TOKENS: Final = 15_000
OUTPUT_TOKEN_MAX: Final = 32_000
IMAGE_TOKENS: Final = 1_500
PDF_TOKENS: Final = 2_000
CHARS_PER_TOKEN: Final = 4
#: Tool results inside a serialized tail or summary request are cut here.
TOOL_RESULT_CHARS: Final = 2_000
#: Per-message estimates kept (count-bounded; the oldest entry goes first).
ESTIMATE_CACHE_ENTRIES: Final = 65_536
#: Sessions whose last history (and its running sums) the estimator keeps.
ESTIMATE_SESSIONS: Final = 256

HEADINGS: Final = (
    "Objective",
    "Requirements",
    "Decisions",
    "Work State",
    "Next Move",
    "Relevant Files",
    "Additional Context",
)

SUMMARY_SYSTEM: Final = (
    "You write checkpoints of long working sessions so that the work can continue from the"
    " checkpoint alone. Be complete about facts, terse in wording."
)
_TEMPLATE: Final = (
    "Use exactly these Markdown headings:\n"
    "## Objective\n## Requirements\n## Decisions\n"
    "## Work State\n### Completed\n### Active\n### Blocked\n"
    "## Next Move\n## Relevant Files\n## Additional Context\n"
    "Cover the goal, every instruction the user gave, what was discovered, the work done,"
    " the files touched and the next steps."
)
SUMMARY_PROMPT: Final = (
    "Summarize the conversation below into a checkpoint. " + _TEMPLATE + "\n\n<conversation>\n"
)
UPDATE_PROMPT: Final = (
    "The conversation below starts with an existing checkpoint. Update that checkpoint with"
    " everything after it; keep what still holds. " + _TEMPLATE + "\n\n<conversation>\n"
)
REMINDER: Final = (
    "Your reply did not use the checkpoint headings. Write the checkpoint again. " + _TEMPLATE
)
SUMMARY_INTRO: Final = "This session was compacted. Checkpoint of the earlier conversation:"
RECENT_INTRO: Final = "The most recent messages, verbatim:"


@attrs.frozen(kw_only=True)
class CompactionSettings:
    """``[runtime] compaction``, ``compaction_buffer``, ``compaction_tail_tokens``."""

    auto: bool = True
    #: Reserved headroom in tokens (the ceiling is context - max(output, buffer)).
    buffer: int = attrs.field(default=BUFFER_TOKENS, validator=attrs.validators.ge(0))
    #: Token budget of the recent tail kept verbatim.
    tail_tokens: int = attrs.field(default=TAIL_TOKENS, validator=attrs.validators.ge(1))


def _tokens(chars: int) -> int:
    return math.ceil(chars / CHARS_PER_TOKEN)


def _message_tokens(message: SessionMessage) -> int:
    match message:
        case UserMessage():
            total = _tokens(len(message.text))
            for f in message.files or ():
                if f.mime.startswith("image/"):
                    total += IMAGE_TOKENS
                elif f.mime == "application/pdf":
                    total += PDF_TOKENS
                else:
                    total += _tokens(len(f.data) * 3 // 4)
            return total
        case SyntheticMessage() | SystemMessage():
            return _tokens(len(message.text))
        case CompactionMessage():
            return _tokens(len(render(message)))
        case AssistantMessage():
            return sum(_part_tokens(p) for p in message.parts)
        case ShellMessage():
            return 0  # the model sees a shell through its notice (synthetic input)


def _part_tokens(part: TextPart | ReasoningPart | ToolPart) -> int:
    if isinstance(part, TextPart | ReasoningPart):
        return _tokens(len(part.text))
    return _tokens(len(part.name) + len(orjson.dumps(part.input or {})) + len(_result(part)))


def _results_tokens(message: AssistantMessage) -> int:
    return sum(_tokens(len(_result(p))) for p in message.parts if isinstance(p, ToolPart))


def _anchor_tokens(message: SessionMessage) -> int | None:
    """What the provider counted for this step, if it is a usable anchor."""
    if not isinstance(message, AssistantMessage) or message.error is not None:
        return None
    t = message.tokens
    if t is None or message.finish is None:
        return None
    total = t.input + t.cache.read + t.cache.write + t.output + t.reasoning
    return total or None


class Estimator:
    """Token estimates of a request, incremental over an unchanged history.

    Two bounded caches: per-message estimates by the decoded message's
    identity (count-bounded, :data:`ESTIMATE_CACHE_ENTRIES`), and per session
    the last history seen with its running sums (:data:`ESTIMATE_SESSIONS`
    sessions, least recently used dropped), so an unchanged prefix costs one
    identity comparison per message, run in C.
    """

    def __init__(
        self, max_entries: int = ESTIMATE_CACHE_ENTRIES, max_sessions: int = ESTIMATE_SESSIONS
    ) -> None:
        self._max = max_entries
        self._max_sessions = max_sessions
        self._cache: dict[int, tuple[SessionMessage, int]] = {}
        self._sums: dict[str, tuple[list[SessionMessage], list[int], list[int]]] = {}

    def message(self, message: SessionMessage) -> int:
        entry = self._cache.get(id(message))
        if entry is not None and entry[0] is message:
            return entry[1]
        tokens = _message_tokens(message)
        if len(self._cache) >= self._max:
            self._cache.pop(next(iter(self._cache)))
        self._cache[id(message)] = (message, tokens)
        return tokens

    def estimate(
        self, history: Sequence[SessionMessage], request: ModelRequest, *, anchor: bool = True
    ) -> int:
        """The tokens of ``request`` built from ``history`` (the active history).

        ``anchor=False`` ignores reported tokens and counts every message.
        """
        sums, anchors = self._track(request.session_id, history)
        at = anchors[-1] if anchor and anchors else -1
        if at >= 0:
            found = history[at]
            assert isinstance(found, AssistantMessage)
            reported = _anchor_tokens(found) or 0
            return reported + _results_tokens(found) + sums[-1] - sums[at]
        fixed = _tokens(sum(map(len, request.system)))
        for tool in request.tools:
            schema = len(orjson.dumps(tool.input_schema))
            fixed += _tokens(len(tool.name) + len(tool.description) + schema)
        return fixed + (sums[-1] if sums else 0)

    def _track(
        self, session_id: str, history: Sequence[SessionMessage]
    ) -> tuple[list[int], list[int]]:
        """Running sums and newest-anchor indexes of ``history``, reusing the prefix
        seen last time for this session (one identity comparison per message)."""
        seen, sums, anchors = self._sums.pop(session_id, ([], [], []))
        n = min(len(seen), len(history))
        if not all(map(operator.is_, history[:n], seen[:n])):
            n = next(i for i in range(n) if history[i] is not seen[i])
        del seen[n:], sums[n:], anchors[n:]
        running = sums[-1] if sums else 0
        newest = anchors[-1] if anchors else -1
        for i in range(n, len(history)):
            m = history[i]
            running += self.message(m)
            if _anchor_tokens(m) is not None:
                newest = i
            seen.append(m)
            sums.append(running)
            anchors.append(newest)
        if len(self._sums) >= self._max_sessions:
            self._sums.pop(next(iter(self._sums)))
        self._sums[session_id] = (seen, sums, anchors)
        return sums, anchors


def select_tail(
    history: Sequence[SessionMessage], budget: int, estimate: Callable[[SessionMessage], int]
) -> int | None:
    """Where the recent tail starts in ``history``; None when nothing is left to summarize.

    A completed compaction heading ``history`` is summary material, never tail.
    """
    first = 1 if history and isinstance(history[0], CompactionMessage) else 0
    users = [
        i
        for i in range(first, len(history))
        if isinstance(history[i], UserMessage | SyntheticMessage)
    ]
    if not users:
        return None
    start, used, fits = len(history) - 1, 0, True
    while start >= first:
        cost = estimate(history[start])
        if used + cost > budget and start < len(history) - 1:
            start, fits = start + 1, False
            break
        used += cost
        start -= 1
    # Forward to a user message, so calls and their results stay together
    # and the tail stays within its budget; when everything fits (or no user
    # message starts within it), the latest exchange alone.
    boundary = None if fits else min((i for i in users if i >= start), default=None)
    if boundary is None:
        boundary = users[-1]
    if not _summarizable(history[:boundary]):
        return None
    return boundary


def _summarizable(prefix: Sequence[SessionMessage]) -> bool:
    return any(not isinstance(m, CompactionMessage) and serialize((m,)) for m in prefix)


# -- plain text ------------------------------------------------------------------------------------


def _cut(text: str, limit: int = TOOL_RESULT_CHARS) -> str:
    if len(text) <= limit:
        return text
    end = limit
    if "\ud800" <= text[end - 1] <= "\udbff":
        end -= 1  # never split a surrogate pair
    return text[:end] + "[truncated]"


def _result(part: ToolPart) -> str:
    if part.status == "completed":
        return "\n".join(
            str(c.get("text", "")) for c in part.content or () if c.get("type") == "text"
        )
    if part.error is not None:
        return str(part.error.get("message", ""))
    return "Tool call did not complete"


def serialize(messages: Sequence[SessionMessage]) -> str:
    """Messages as plain text: what a summary request reads and a tail keeps."""
    out: list[str] = []
    for m in messages:
        match m:
            case UserMessage():
                files = "".join(f"\n[file {f.name or ''} {f.mime}]" for f in m.files or ())
                out.append(f"[user]\n{m.text}{files}")
            case SyntheticMessage():
                out.append(f"[user]\n{m.text}")
            case SystemMessage():
                out.append(f"[system]\n{m.text}")
            case CompactionMessage() if m.status == "completed":
                out.append(f"[checkpoint]\n{m.text or ''}")
                if m.recent:
                    out.append(m.recent)
            case AssistantMessage():
                pieces = []
                for p in m.parts:
                    if isinstance(p, TextPart) and p.text:
                        pieces.append(p.text)
                    elif isinstance(p, ToolPart):
                        call = orjson.dumps(p.input or {}).decode()
                        pieces.append(f"[tool {p.name}] {call}\n[result] {_cut(_result(p))}")
                if pieces:
                    out.append("[assistant]\n" + "\n".join(pieces))
    return "\n\n".join(out)


def render(message: CompactionMessage) -> str:
    """The model's view of a completed compaction: the summary, then the tail."""
    text = f"{SUMMARY_INTRO}\n\n{message.text or ''}"
    if message.recent:
        text += f"\n\n{RECENT_INTRO}\n\n{message.recent}"
    return text


# -- running one ----------------------------------------------------------------------------------


class CompactionFailedError(Exception):
    def __init__(self, error: ev.ErrorInfo, usage: Usage | None = None) -> None:
        super().__init__(error.message)
        self.error = error
        self.usage = usage


class Compactor:
    def __init__(
        self,
        *,
        store: Store,
        bus: EventBus,
        providers: ProviderRegistry,
        retry: RetryPolicy,
        limits: Callable[[ModelRef], ModelLimits | None],
        settings: CompactionSettings | None = None,
        clock: Clock = SYSTEM,
    ) -> None:
        #: What a retry's backoff waits on.
        self._clock = clock
        self._store = store
        self._bus = bus
        self._providers = providers
        self._retry = retry
        self._limits = limits
        self.settings = settings or CompactionSettings()
        self.estimator = Estimator()

    def enabled(self, agent_override: bool | None) -> bool:
        return self.settings.auto if agent_override is None else agent_override

    def ceiling(self, model: ModelRef) -> int | None:
        limits = self._limits(model)
        if limits is None:
            return None
        output = min(limits.output, OUTPUT_TOKEN_MAX)
        ceiling = limits.context - max(output, self.settings.buffer)
        # A window smaller than the buffer cannot keep it: only the output is
        # reserved then, or every step would compact.
        return ceiling if ceiling > 0 else limits.context - output

    def due(
        self, history: Sequence[SessionMessage], request: ModelRequest, auto: bool
    ) -> int | None:
        """Where the tail starts when the step must compact first; None otherwise."""
        if not auto or not history:
            return None
        last = history[-1]
        if isinstance(last, CompactionMessage) and last.status == "completed":
            return None
        ceiling = self.ceiling(request.model)
        if ceiling is None or self.estimator.estimate(history, request) < ceiling:
            return None
        return self.tail(history)

    def tail(self, history: Sequence[SessionMessage]) -> int | None:
        return select_tail(history, self.settings.tail_tokens, self.estimator.message)

    async def settle(self, session_id: str, stale: CompactionMessage) -> str | None:
        """Fail ``stale``, a compaction read as still running at a drain's start.

        A manual one cut off for the first time starts again in the same
        command (see the module doc): returns the id it now runs under, for
        the caller to :meth:`run`; None when nothing is to run.
        """
        again = None
        if stale.reason == "manual" and stale.input_id is not None:
            again = recovered_id(stale.input_id)
        failed = ev.CompactionFailed(
            session_id=session_id,
            reason=stale.reason,
            input_id=stale.input_id,
            error=ev.ErrorInfo(type="compaction.interrupted", message="Compaction interrupted"),
        )
        if again is None:
            await self._store.append(Command.of(failed))
            return None
        started = ev.CompactionStarted(
            session_id=session_id, reason="manual", recent="", input_id=again
        )
        await self._store.append(Command.of(failed, started))
        return again

    async def run(
        self,
        session_id: str,
        model: ModelRef,
        history: Sequence[SessionMessage],
        reason: ev.CompactionReason,
        *,
        script: str | None = None,
        input_id: str | None = None,
    ) -> ev.ErrorInfo | None:
        """Compact ``history`` (the active one): None once ``compaction.ended`` is
        durable, else the error its ``compaction.failed`` recorded.

        An auto compaction publishes ``started`` here; a manual one was started
        with its control item's delivery. A cancelled compaction records its
        failure (``aborted`` for a manual one) before the cancellation goes on.
        """
        start = self.tail(history)
        recent = "" if start is None else serialize(history[start:])
        if reason == "auto":
            await self._store.append(
                Command.of(
                    ev.CompactionStarted(session_id=session_id, reason=reason, recent=recent)
                )
            )
        try:
            if start is None:
                raise CompactionFailedError(
                    ev.ErrorInfo(
                        type="compaction.unavailable",
                        message="Nothing older than the latest exchange to summarize",
                    )
                )
            text, usage = await self._summarize(session_id, model, history[:start], script)
        except asyncio.CancelledError:
            error = (
                ev.ErrorInfo(type="aborted", message="Compaction cancelled")
                if reason == "manual"
                else ev.ErrorInfo(type="compaction.interrupted", message="Compaction interrupted")
            )
            await finish(self._failed(session_id, reason, input_id, error, None))
            raise
        except CompactionFailedError as exc:
            await self._failed(session_id, reason, input_id, exc.error, exc.usage)
            return exc.error
        await self._store.append(
            Command.of(
                ev.CompactionEnded(
                    session_id=session_id,
                    reason=reason,
                    model=model,
                    text=text,
                    recent=recent,
                    cost=usage.cost,
                    tokens=step_tokens(usage),
                )
            )
        )
        return None

    async def _failed(
        self,
        session_id: str,
        reason: ev.CompactionReason,
        input_id: str | None,
        error: ev.ErrorInfo,
        usage: Usage | None,
    ) -> None:
        await self._store.append(
            Command.of(
                ev.CompactionFailed(
                    session_id=session_id,
                    reason=reason,
                    input_id=input_id,
                    error=error,
                    cost=None if usage is None else usage.cost,
                    tokens=None if usage is None else step_tokens(usage),
                )
            )
        )

    async def _summarize(
        self,
        session_id: str,
        model: ModelRef,
        prefix: Sequence[SessionMessage],
        script: str | None,
    ) -> tuple[str, Usage]:
        update = bool(prefix) and isinstance(prefix[0], CompactionMessage)
        prompt = (UPDATE_PROMPT if update else SUMMARY_PROMPT) + serialize(prefix)
        prompt += "\n</conversation>"
        messages: tuple[ChatMessage, ...] = (
            ChatMessage(role="user", parts=(TextContent(text=prompt),)),
        )
        policy = attrs.evolve(self._retry)  # one retry allowance per compaction
        retries = 0
        attempt = 0
        total = Usage()
        reminded = False
        while True:
            attempt += 1
            metadata: dict[str, object] = {"purpose": "compaction", "attempt": attempt}
            if script is not None:
                metadata["script"] = script
            request = ModelRequest(
                session_id=session_id,
                agent="compaction",
                model=model,
                system=(SUMMARY_SYSTEM,),
                messages=messages,
                metadata=metadata,
            )
            try:
                text, finished = await self._stream(session_id, request)
            except ProviderError as exc:
                retries += 1
                delay = policy.decide(exc, retries)
                if delay is None:
                    raise CompactionFailedError(
                        ev.ErrorInfo(type=exc.type, message=exc.message), total
                    ) from None
                await self._clock.sleep(delay / 1000)
                continue
            total = _add(total, finished.usage)
            if finished.reason == "length":
                raise CompactionFailedError(
                    ev.ErrorInfo(
                        type="compaction.failed", message="The summary hit the output limit"
                    ),
                    total,
                )
            if finished.reason == "content-filter":
                raise CompactionFailedError(
                    ev.ErrorInfo(
                        type="provider.content-filter",
                        message="The provider filtered the summary",
                    ),
                    total,
                )
            if reminded or any(f"# {h}" in text for h in HEADINGS):
                return text, total
            # No heading at all: one reminder, then take what comes.
            reminded = True
            messages = (
                *messages,
                ChatMessage(role="assistant", parts=(TextContent(text=text or "(empty)"),)),
                ChatMessage(role="user", parts=(TextContent(text=REMINDER),)),
            )

    async def _stream(self, session_id: str, request: ModelRequest) -> tuple[str, Finish]:
        provider = self._providers.resolve(request.model)
        pieces: list[str] = []
        async with contextlib.aclosing(provider.stream(request)) as stream:
            async for part in stream:
                if isinstance(part, TextChunk):
                    pieces.append(part.delta)
                    self._bus.live(ev.CompactionDelta(session_id=session_id, text=part.delta))
                elif isinstance(part, Finish):
                    return "".join(pieces), part
        raise CompactionFailedError(
            ev.ErrorInfo(type="compaction.failed", message="The summary stream ended early")
        )


def _add(a: Usage, b: Usage) -> Usage:
    return Usage(
        input=a.input + b.input,
        output=a.output + b.output,
        reasoning=a.reasoning + b.reasoning,
        cache_read=a.cache_read + b.cache_read,
        cache_write=a.cache_write + b.cache_write,
        cost=a.cost + b.cost,
    )
