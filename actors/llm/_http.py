"""The transport both provider adapters share: one aiohttp session, SSE, typed failures.

:class:`HttpTransport` posts a JSON body and yields the response's server-sent
events, turning every way that can fail into a :class:`~actors.llm.ProviderError`
with the delivery state retry needs:

- the connection could not be made (refused, DNS, connect timeout):
  :class:`TransportError` ``not-sent``, the provider never saw the request;
- it broke before the response status arrived: ``unknown`` delivery;
- a non-2xx status (a 3xx too: redirects are never followed, so a key never
  reaches where one points): classified from the status, the error body and the
  ``retry-after``/``retry-after-ms``/``x-should-retry`` headers by the
  adapter's ``classify`` (the formats differ);
- it broke, stalled past the idle-read timeout or ended after the stream
  started: :class:`IncompleteStreamError`, the adapter adds whether output was
  produced;
- a 2xx ``application/json`` answer to the stream request (gateways do this:
  LiteLLM's proxy for a mock model) is read whole, up to
  :data:`MAX_JSON_ANSWER` bytes, and handed over as one :class:`JSONAnswer`
  that the adapter reads as the complete message; any other content type that
  carries no event at all is an :class:`IncompleteStreamError` naming it.

Messages never carry the key, the host or the URL: aiohttp's own exception
texts name the host, so only their class names are used, and provider texts
pass through :meth:`HttpTransport.scrub`.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import logging
import math
import re
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any, Final, Protocol
from urllib.parse import urlsplit

import aiohttp
import attrs
import orjson

from actors.llm._config import ProviderConfig
from actors.llm._errors import IncompleteStreamError, ProviderError, TransportError
from actors.llm._stream import StreamPart
from protocol.sse import MAX_LINE_BYTES, SSEDecoder, SSEFrame, SSELineTooLongError

__all__ = [
    "CONNECT_TIMEOUT_S",
    "IDLE_READ_TIMEOUT_S",
    "MAX_JSON_ANSWER",
    "ErrorClassifier",
    "HttpTransport",
    "JSONAnswer",
    "StreamBrokenError",
    "StreamState",
    "error_body",
    "normalized",
    "retry_after_ms",
    "should_retry",
]

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S: Final = 30.0
#: The longest silence between two reads of a streaming response. Providers
#: send keep-alives (Anthropic ``ping``, comments) well inside this.
IDLE_READ_TIMEOUT_S: Final = 300.0
#: An error body longer than this is not read further (it is only for the message).
MAX_ERROR_BODY: Final = 64 * 1024
#: A provider message is cut to this many characters in an error.
MAX_MESSAGE: Final = 2000
#: How long the bytes after a stream's last event are awaited. Reading them
#: lets aiohttp return the connection to its pool (an unread body closes it,
#: and the next step would pay a new TCP and TLS handshake).
DRAIN_TIMEOUT_S: Final = 1.0

#: The largest whole JSON answer read in place of a stream (a message no
#: model's output limit comes near; the same bound as one SSE line).
MAX_JSON_ANSWER: Final = MAX_LINE_BYTES
_EVENT_STREAM: Final = "text/event-stream"

ErrorClassifier = Callable[[int, Mapping[str, str], bytes], ProviderError]


class StreamBrokenError(Exception):
    """The response stream broke after it started; the adapter decides the error."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class NotAStreamError(StreamBrokenError):
    """A 2xx answer that is no event stream and no readable JSON message."""


@attrs.frozen
class JSONAnswer:
    """A whole ``application/json`` answer to a stream request, decoded."""

    content_type: str
    data: Any


def _is_json(content_type: str) -> bool:
    return content_type == "application/json" or content_type.endswith("+json")


def retry_after_ms(headers: Mapping[str, str], *, now: float | None = None) -> int | None:
    """The provider's hint in ms: ``retry-after-ms``, else ``retry-after`` (seconds or a date)."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        try:
            value = float(raw_ms)
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value >= 0:
            return math.ceil(value)
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
        return max(0, math.ceil(seconds * 1000))
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return math.ceil(seconds * 1000)


def should_retry(headers: Mapping[str, str]) -> bool | None:
    """``x-should-retry: true|false`` as an override, None when absent or unreadable."""
    value = headers.get("x-should-retry", "").strip().lower()
    return {"true": True, "false": False}.get(value)


def error_body(body: bytes) -> Mapping[str, Any]:
    """The ``error`` object of a JSON error body (both formats nest it there), or {}."""
    try:
        decoded = orjson.loads(body)
    except orjson.JSONDecodeError:
        return {}
    if isinstance(decoded, dict):
        inner = decoded.get("error")
        if isinstance(inner, dict):
            return inner
        return decoded
    return {}


class HttpTransport:
    """One provider's HTTP client: a lazily made aiohttp session, closed by its owner."""

    def __init__(
        self,
        config: ProviderConfig,
        *,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        idle_read_timeout_s: float = IDLE_READ_TIMEOUT_S,
    ) -> None:
        self.config = config
        self._timeout = aiohttp.ClientTimeout(
            total=None,
            connect=connect_timeout_s,
            sock_connect=connect_timeout_s,
            sock_read=idle_read_timeout_s,
        )
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        parts = urlsplit(config.base_url)
        self._secrets = tuple(s for s in (parts.netloc, parts.hostname or "") if s)

    def _client(self) -> aiohttp.ClientSession:
        if self._closed:
            raise TransportError(f"provider {self.config.id!r} is closed", delivery="not-sent")
        if self._session is None:
            # Made on first use, inside the running loop; one per provider so
            # its connection pool is shared by every session's steps.
            self._session = aiohttp.ClientSession(
                timeout=self._timeout,
                json_serialize=lambda v: orjson.dumps(v).decode(),
                auto_decompress=True,
            )
        return self._session

    async def aclose(self) -> None:
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def scrub(self, text: str, key: str | None) -> str:
        """``text`` without the key (nor a masked fragment of it), the host or the URL."""
        text = text[:MAX_MESSAGE]
        secrets = [*self._secrets]
        if key:
            secrets.append(key)
        for secret in secrets:
            text = text.replace(secret, "[redacted]")
        if key and len(key) >= 12:
            # Providers echo a masked key ("sk-abc***wxyz"): a token sharing
            # the key's head or tail goes too.
            head, tail = key[:6], key[-4:]

            def redact(match: re.Match[str]) -> str:
                token = match.group(0)
                return "[redacted]" if head in token or tail in token else token

            text = re.sub(r"[^\s\"'`,;()<>]{8,}", redact, text)
        return text

    async def stream(
        self,
        url: str,
        headers: Mapping[str, str],
        body: Mapping[str, Any],
        classify: ErrorClassifier,
    ) -> AsyncGenerator[SSEFrame | JSONAnswer, None]:
        """POST ``body`` and yield the SSE events of a 2xx answer, or its one
        :class:`JSONAnswer` when it came as JSON (see the module doc)."""
        payload = orjson.dumps(body)
        session = self._client()
        name = self.config.id
        try:
            # Never followed: aiohttp would re-send custom headers (``x-api-key``)
            # and the prompt to wherever a 3xx points, another origin included.
            # A redirect is answered like any other non-2xx: a provider error.
            response = await session.post(
                url,
                data=payload,
                headers={**headers, "content-type": "application/json"},
                allow_redirects=False,
            )
        except aiohttp.ClientConnectorError as exc:
            raise TransportError(
                f"provider {name!r}: cannot connect ({type(exc).__name__})", delivery="not-sent"
            ) from None
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            connect_timeout = type(exc).__name__ == "ConnectionTimeoutError"
            raise TransportError(
                f"provider {name!r}: the request failed before an answer ({type(exc).__name__})",
                delivery="not-sent" if connect_timeout else "unknown",
            ) from None
        async with response:
            if response.status >= 300:
                raw = b""
                try:
                    while len(raw) < MAX_ERROR_BODY:
                        piece = await response.content.readany()
                        if not piece:
                            break
                        raw += piece
                except (TimeoutError, aiohttp.ClientError, OSError):
                    pass  # the status alone still classifies the failure
                raise classify(response.status, response.headers, raw)
            content_type = response.content_type
            content = response.content
            if _is_json(content_type):
                yield await _json_answer(content, content_type)
                return
            decoder = SSEDecoder()
            seen = False
            try:
                while True:
                    chunk = await content.readany()
                    if not chunk:
                        break
                    for event in decoder.feed(chunk):
                        seen = True
                        yield event
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                raise StreamBrokenError(type(exc).__name__) from None
            except SSELineTooLongError as exc:
                raise StreamBrokenError(str(exc)) from None
            for event in decoder.end(dispatch_open=True):
                seen = True
                yield event
            if not seen and content_type != _EVENT_STREAM:
                # Said once here rather than as "ended before its finish":
                # the answer was never a stream (an HTML error page, say).
                raise NotAStreamError(
                    f"the provider answered {content_type or 'without a content type'}"
                    f", not {_EVENT_STREAM}"
                )


async def _json_answer(content: aiohttp.StreamReader, content_type: str) -> JSONAnswer:
    chunks: list[bytes] = []
    size = 0
    try:
        while piece := await content.readany():
            size += len(piece)
            if size > MAX_JSON_ANSWER:
                raise NotAStreamError(
                    f"the provider's {content_type} answer exceeds {MAX_JSON_ANSWER} bytes"
                )
            chunks.append(piece)
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        raise StreamBrokenError(type(exc).__name__) from None
    try:
        data = orjson.loads(b"".join(chunks))
    except orjson.JSONDecodeError:
        raise NotAStreamError(f"the provider's {content_type} answer is no JSON") from None
    return JSONAnswer(content_type=content_type, data=data)


class StreamState(Protocol):
    """A format's parser: SSE events in, normalized parts out (see the adapters)."""

    @property
    def done(self) -> bool: ...

    def event(self, event: SSEFrame) -> list[StreamPart]: ...

    def end(self) -> list[StreamPart]: ...

    def answer(self, answer: JSONAnswer) -> list[StreamPart]:
        """Every part of a whole JSON answer, its Finish last (or raises)."""
        ...

    def incomplete(self, why: str) -> IncompleteStreamError: ...


async def normalized(
    transport: HttpTransport,
    url: str,
    headers: Mapping[str, str],
    body: Mapping[str, Any],
    classify: ErrorClassifier,
    state: StreamState,
    key: str | None,
) -> AsyncGenerator[StreamPart, None]:
    """One model call: POST, parse each event with ``state``, end with its Finish.

    The closing parts are held until the body's tail is read (within
    :data:`DRAIN_TIMEOUT_S`), so the consumer, which stops at the Finish,
    never leaves the connection half-read. Every error's message is scrubbed.
    """
    events = transport.stream(url, headers, body, classify)
    final: list[StreamPart] | None = None
    try:
        async with contextlib.aclosing(events):
            async for event in events:
                if isinstance(event, JSONAnswer):
                    final = state.answer(event)
                    break
                parts = state.event(event)
                if state.done:
                    final = parts
                    break
                for part in parts:
                    yield part
            if final is not None:
                with contextlib.suppress(StreamBrokenError, TimeoutError):
                    async with asyncio.timeout(DRAIN_TIMEOUT_S):
                        async for _tail in events:
                            pass
        if final is None:
            final = state.end()
    except NotAStreamError as exc:
        raise state.incomplete(exc.reason) from None
    except StreamBrokenError as exc:
        raise state.incomplete(f"the stream broke ({exc.reason})") from None
    except ProviderError as exc:
        exc.message = transport.scrub(exc.message, key)
        exc.args = (exc.message,)
        raise
    for part in final:
        yield part
