"""The scripted provider's script language: parsing text into a :class:`Script`.

The syntax is documented for users in :mod:`actors.llm.scripted`; this module
turns it into values. Parsing is pure, so a script is checked the same way
whether it comes from an agent's configuration or from a prompt.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Final, Literal

import attrs

from actors.llm._errors import (
    SEND_STATES,
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
    SendState,
    TransportError,
    UnsupportedOperationError,
)
from actors.llm._stream import FINISH_REASONS, FinishReason
from protocol import codec
from protocol.errors import InvalidRequestError

__all__ = [
    "DEFAULT_CHUNK",
    "FAILURE_KINDS",
    "Block",
    "Failure",
    "HostedResultBlock",
    "Script",
    "ScriptError",
    "Step",
    "Summary",
    "TextBlock",
    "ToolBlock",
    "find_script",
    "find_summary",
    "parse_script",
]

DEFAULT_CHUNK: Final = 8

FAILURE_KINDS: Final[Mapping[str, type[ProviderError]]] = {
    "rate-limit": RateLimitError,
    "internal": ProviderInternalError,
    "unknown": ProviderError,
    "transport": TransportError,
    "incomplete": IncompleteStreamError,
    "context-overflow": ContextOverflowError,
    "auth": AuthenticationError,
    "quota": QuotaExceededError,
    "content-policy": ContentPolicyError,
    "invalid-request": ProviderInvalidRequestError,
    "unsupported": UnsupportedOperationError,
    "no-route": NoRouteError,
}

_KEYWORDS: Final = frozenset(
    {
        "text",
        "reasoning",
        "tool",
        "hosted",
        "hosted-result",
        "delay",
        "chunk",
        "fail",
        "finish",
        "usage",
        "step",
        "summary",
        "summary-delay",
        "summary-fail",
    }
)
#: Directives of compaction requests; a model step ignores them.
_SUMMARY_KEYWORDS: Final = frozenset({"summary", "summary-delay", "summary-fail"})
_DIRECTIVE: Final = re.compile(r"#([a-z][a-z-]*)(?:[ \t](.*))?")
_USAGE_KEYS: Final = {
    "input": "input",
    "output": "output",
    "reasoning": "reasoning",
    "cache-read": "cache_read",
    "cache-write": "cache_write",
    "cost": "cost",
}


class ScriptError(ValueError):
    """A script does not follow the syntax; ``line`` is 1-based."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line


@attrs.frozen(kw_only=True)
class TextBlock:
    """A text or reasoning block, with the pace it streams at."""

    kind: Literal["text", "reasoning"]
    text: str
    delay_ms: int = 0
    chunk: int = DEFAULT_CHUNK


@attrs.frozen(kw_only=True)
class ToolBlock:
    """One tool call, its input streamed as JSON text at the given pace."""

    name: str
    input: Mapping[str, Any]
    delay_ms: int = 0
    chunk: int = DEFAULT_CHUNK
    #: A provider-executed call (``#hosted``): recorded, never run locally.
    hosted: bool = False


@attrs.frozen(kw_only=True)
class HostedResultBlock:
    """The provider's result of the step's latest ``#hosted`` call."""

    content: Mapping[str, Any]
    error: bool = False


Block = TextBlock | ToolBlock | HostedResultBlock


@attrs.frozen(kw_only=True)
class Failure:
    """A ``#fail`` directive: which error, on which attempts, and when."""

    kind: str
    attempts: int | None = None
    after_output: bool = False
    retry_after_ms: int | None = None
    delivery: SendState = "unknown"
    should_retry: bool | None = None

    def applies(self, attempt: int) -> bool:
        """Whether physical attempt ``attempt`` (1-based) fails."""
        return self.attempts is None or attempt <= self.attempts

    def error(self, message: str) -> ProviderError:
        cls = FAILURE_KINDS[self.kind]
        if issubclass(cls, RateLimitError | ProviderInternalError):
            return cls(
                message,
                retry_after_ms=self.retry_after_ms,
                should_retry_override=self.should_retry,
            )
        if issubclass(cls, TransportError):
            return TransportError(
                message, delivery=self.delivery, should_retry_override=self.should_retry
            )
        return cls(message, should_retry_override=self.should_retry)


@attrs.frozen(kw_only=True)
class Step:
    """One model call's worth of script."""

    blocks: tuple[Block, ...] = ()
    finish: FinishReason | None = None
    usage: Mapping[str, int | float] = attrs.field(factory=dict)
    failure: Failure | None = None


@attrs.frozen(kw_only=True)
class Script:
    steps: tuple[Step, ...] = ()


def parse_script(text: str) -> Script:
    """Parse a configured script: every line is a directive, a comment or blank.

    Raises :class:`ScriptError` naming the first offending line.
    """
    script, _ = _parse(text, strict=True)
    return script


def find_script(text: str) -> Script | None:
    """The script embedded in prose (a prompt), or ``None`` when it has no directive.

    Lines that are not directives, including ``#words`` that are not keywords,
    are ignored; a recognised directive with bad arguments still raises
    :class:`ScriptError`.
    """
    script, found = _parse(text, strict=False)
    return script if found else None


@attrs.frozen(kw_only=True)
class Summary:
    """What a compaction request gets from a script: text, pace, a failure."""

    text: str | None = None
    delay_ms: int = 0
    failure: Failure | None = None


def find_summary(text: str) -> Summary:
    """The ``#summary`` text of ``text`` (the last block of them), its
    ``#summary-delay`` and its ``#summary-fail`` (same kinds and options as ``#fail``).

    Consecutive ``#summary`` lines form one block joined by newlines; a later
    block replaces an earlier one (the newest prompt's wins).
    """
    blocks: list[list[str]] = []
    delay = 0
    failure: Failure | None = None
    last_was_summary = False
    for number, raw in enumerate(text.splitlines(), start=1):
        match = _DIRECTIVE.fullmatch(raw.strip())
        keyword = match.group(1) if match else None
        argument = (match.group(2) or "") if match else ""
        if keyword == "summary":
            piece = argument.rstrip()
            if last_was_summary:
                blocks[-1].append(piece)
            else:
                blocks.append([piece])
            last_was_summary = True
            continue
        last_was_summary = False
        if keyword == "summary-delay":
            delay = _int(number, "#summary-delay", argument.strip(), minimum=0)
        elif keyword == "summary-fail":
            builder = _StepBuilder(separator_line=number)
            builder._fail(number, argument)
            failure = builder.failure
    return Summary(text="\n".join(blocks[-1]) if blocks else None, delay_ms=delay, failure=failure)


def _parse(text: str, *, strict: bool) -> tuple[Script, bool]:
    """The script, and whether ``text`` held any directive at all."""
    steps: list[_StepBuilder] = [_StepBuilder(separator_line=0)]
    seen_directive = False
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if line == "---":
            steps.append(_StepBuilder(separator_line=number))
            continue
        match = _DIRECTIVE.fullmatch(line)
        if match is None or match.group(1) not in _KEYWORDS:
            if strict and line and not (line == "#" or line.startswith(("# ", "#\t"))):
                what = "unknown directive" if match else "not a directive or comment"
                raise ScriptError(number, f"{what}: {line!r}")
            continue
        seen_directive = True
        keyword, argument = match.group(1), match.group(2) or ""
        if keyword in _SUMMARY_KEYWORDS:
            continue  # read by compaction requests only (find_summary)
        if keyword == "step":
            if argument.strip():
                raise ScriptError(number, "#step takes no argument")
            steps.append(_StepBuilder(separator_line=number))
        else:
            steps[-1].apply(number, keyword, argument)
    while steps and steps[0].empty:
        steps.pop(0)
    while steps and steps[-1].empty:
        steps.pop()
    for builder in steps:
        if builder.empty:
            raise ScriptError(
                builder.separator_line, "empty step: nothing since the last separator"
            )
    return Script(steps=tuple(b.build() for b in steps)), seen_directive


class _StepBuilder:
    """Collects one step's directives in order; ``#delay``/``#chunk`` set the pace onward."""

    def __init__(self, *, separator_line: int) -> None:
        self.separator_line = separator_line
        self.blocks: list[Block] = []
        self.finish: FinishReason | None = None
        self.usage: dict[str, int | float] = {}
        self.failure: Failure | None = None
        self.delay_ms = 0
        self.chunk = DEFAULT_CHUNK
        self.empty = True
        # The kind of the previous directive, to join consecutive #text lines.
        self._last: str | None = None

    def build(self) -> Step:
        return Step(
            blocks=tuple(self.blocks),
            finish=self.finish,
            usage=dict(self.usage),
            failure=self.failure,
        )

    def apply(self, line: int, keyword: str, argument: str) -> None:
        self.empty = False
        last, self._last = self._last, keyword
        if keyword in ("text", "reasoning"):
            content = argument.rstrip()
            previous = self.blocks[-1] if self.blocks else None
            if last == keyword and isinstance(previous, TextBlock):
                self.blocks[-1] = attrs.evolve(previous, text=f"{previous.text}\n{content}")
            else:
                kind: Literal["text", "reasoning"] = "text" if keyword == "text" else "reasoning"
                self.blocks.append(
                    TextBlock(kind=kind, text=content, delay_ms=self.delay_ms, chunk=self.chunk)
                )
        elif keyword == "tool":
            self.blocks.append(self._tool(line, argument))
        elif keyword == "hosted":
            self.blocks.append(attrs.evolve(self._tool(line, argument), hosted=True))
        elif keyword == "hosted-result":
            self.blocks.append(self._hosted_result(line, argument))
        elif keyword == "delay":
            self.delay_ms = _int(line, "#delay", argument.strip(), minimum=0)
        elif keyword == "chunk":
            self.chunk = _int(line, "#chunk", argument.strip(), minimum=1)
        elif keyword == "finish":
            self._finish(line, argument.strip())
        elif keyword == "usage":
            self._usage(line, argument)
        else:
            self._fail(line, argument)

    def _tool(self, line: int, argument: str) -> ToolBlock:
        name, _, raw = argument.strip().partition(" ")
        if not name:
            raise ScriptError(line, "#tool needs a name")
        raw = raw.strip() or "{}"
        try:
            value = codec.loads(raw)
        except InvalidRequestError:
            raise ScriptError(line, f"#tool {name}: input is not JSON: {raw!r}") from None
        if not isinstance(value, dict):
            raise ScriptError(line, f"#tool {name}: input must be a JSON object")
        return ToolBlock(name=name, input=value, delay_ms=self.delay_ms, chunk=self.chunk)

    def _hosted_result(self, line: int, argument: str) -> HostedResultBlock:
        if not any(isinstance(b, ToolBlock) and b.hosted for b in self.blocks):
            raise ScriptError(line, "#hosted-result needs a #hosted call before it")
        raw = argument.strip()
        error = raw == "error" or raw.startswith("error ")
        if error:
            raw = raw[len("error") :].strip()
        try:
            value = codec.loads(raw or "{}")
        except InvalidRequestError:
            raise ScriptError(line, f"#hosted-result: content is not JSON: {raw!r}") from None
        if not isinstance(value, dict):
            raise ScriptError(line, "#hosted-result: content must be a JSON object")
        return HostedResultBlock(content=value, error=error)

    def _finish(self, line: int, reason: str) -> None:
        if self.finish is not None:
            raise ScriptError(line, "a step has at most one #finish")
        for known in FINISH_REASONS:
            if reason == known:
                self.finish = known
                return
        raise ScriptError(line, f"#finish expects one of {', '.join(FINISH_REASONS)}")

    def _usage(self, line: int, argument: str) -> None:
        if not argument.split():
            raise ScriptError(line, "#usage needs at least one <key>=<n>")
        for item in argument.split():
            key, sep, value = item.partition("=")
            if not sep or key not in _USAGE_KEYS:
                raise ScriptError(line, f"#usage expects {'|'.join(_USAGE_KEYS)}=<n>: {item!r}")
            if key == "cost":
                self.usage["cost"] = _cost(line, value)
            else:
                self.usage[_USAGE_KEYS[key]] = _int(line, f"#usage {key}", value, minimum=0)

    def _fail(self, line: int, argument: str) -> None:
        if self.failure is not None:
            raise ScriptError(line, "a step has at most one #fail")
        kind, *options = argument.split() or [""]
        if kind not in FAILURE_KINDS:
            raise ScriptError(line, f"#fail expects one of {', '.join(FAILURE_KINDS)}")
        fields: dict[str, Any] = {}
        for option in options:
            key, sep, value = option.partition("=")
            if option == "once":
                fields["attempts"] = 1
            elif option == "after-output":
                fields["after_output"] = True
            elif sep and key == "attempts":
                fields["attempts"] = _int(line, "attempts", value, minimum=1)
            elif sep and key == "should-retry" and value in ("true", "false"):
                fields["should_retry"] = value == "true"
            elif sep and key == "retry-after" and kind in ("rate-limit", "internal"):
                fields["retry_after_ms"] = _int(line, "retry-after", value, minimum=0)
            elif sep and key == "delivery" and kind == "transport":
                delivery = next((d for d in SEND_STATES if d == value), None)
                if delivery is None:
                    raise ScriptError(line, f"delivery expects {'|'.join(SEND_STATES)}")
                fields["delivery"] = delivery
            else:
                raise ScriptError(line, f"#fail {kind}: unknown option {option!r}")
        self.failure = Failure(kind=kind, **fields)


def _int(line: int, what: str, value: str, *, minimum: int) -> int:
    if not value.isascii() or not value.isdigit() or int(value) < minimum:
        raise ScriptError(line, f"{what} expects an integer >= {minimum}, not {value!r}")
    return int(value)


def _cost(line: int, value: str) -> float:
    try:
        cost = float(value)
    except ValueError:
        cost = math.nan
    if not math.isfinite(cost) or cost < 0:
        raise ScriptError(line, f"#usage cost expects a number >= 0, not {value!r}")
    return cost
