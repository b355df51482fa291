"""The client's HTTP half: its state, one request, and reading the answer.

Every answer is read the same way, whatever the operation:

- a non-2xx JSON body whose ``_tag`` :func:`protocol.errors.from_wire` knows
  raises that :class:`~protocol.errors.DomainError`, declared or not;
- any other failure raises :class:`ClientError` with a ``reason``.

    SessionRtError
    ├── DomainError ...                 the server said no (see protocol.errors)
    └── ClientError                     we could not get a usable answer
          reason="closed"                   the client is not open (our side)
          reason="transport"                connect/read failed or timed out
          reason="unexpected_status"        a status the operation does not answer with
          reason="unsupported_content_type" a 2xx whose body is not what the op returns
          reason="malformed_response"       bad JSON, or JSON of the wrong shape
"""

from __future__ import annotations

import collections.abc
import math
import typing
from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import quote

import aiohttp
import attrs
import orjson
from yarl import URL

from protocol import codec, errors
from protocol.lifecycle import Lifecycle, LifecycleState
from protocol.operations import Operation
from protocol.shapes import Page, PageCursor

__all__ = ["CallOptions", "ClientError", "Connection", "Reason"]

Reason = Literal[
    "transport", "unexpected_status", "unsupported_content_type", "malformed_response", "closed"
]

_JSON: typing.Final = "application/json"
_SNIPPET: typing.Final = 200


class ClientError(errors.SessionRtError):
    """An infrastructure failure: no declared answer could be read from the server.

    ``reason`` says which; ``status`` is the HTTP status when a response arrived.
    """

    __module__ = "protocol.client"

    def __init__(
        self,
        reason: Reason,
        message: str,
        *,
        status: int | None = None,
        operation: str | None = None,
    ) -> None:
        super().__init__(message)
        self.reason: Reason = reason
        self.message = message
        self.status = status
        self.operation = operation

    def __repr__(self) -> str:
        return f"ClientError(reason={self.reason!r}, status={self.status!r}, {self.message!r})"


@attrs.frozen(kw_only=True)
class CallOptions:
    """Per-call transport options, kept apart from the operation's input.

    ``timeout`` (seconds) replaces the client's for this call; ``None`` keeps
    the client's and ``math.inf`` means no deadline. For a stream it bounds
    opening it (up to the response headers), never how long it stays open.
    ``headers`` are merged over the client's. Cancel a call by cancelling
    the task that awaits it.
    """

    timeout: float | None = None
    headers: Mapping[str, str] | None = None


class _Closable(typing.Protocol):
    async def aclose(self) -> None: ...


class Connection:
    """What the operation groups share: the aiohttp session, defaults and open streams."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str] | None,
        connector: aiohttp.BaseConnector | None,
        connector_owner: bool,
        timeout: float | None,
    ) -> None:
        url = URL(base_url)
        if not url.absolute:
            raise ValueError(f"base_url must be absolute, got {base_url!r}")
        self.base_url = url
        self.headers: dict[str, str] = dict(headers or {})
        self.timeout = timeout
        #: Unopened -> open -> closed, once (never closing: the close is one step).
        self.lifecycle = Lifecycle("this client")
        self.streams: set[_Closable] = set()
        self._connector = connector
        self._connector_owner = connector_owner
        self._session: aiohttp.ClientSession | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def state(self) -> LifecycleState:
        return self.lifecycle.state

    def open(self) -> None:
        if self.state is not LifecycleState.UNOPENED:
            what = "open" if self.state is LifecycleState.OPEN else "closed"
            raise RuntimeError(f"this client is already {what}; a client can be opened once")
        self._session = aiohttp.ClientSession(
            headers=self.headers,
            connector=self._connector,
            connector_owner=self._connector is None or self._connector_owner,
            # Deadlines are ours (asyncio.timeout per call), so streams are not cut by a total.
            timeout=aiohttp.ClientTimeout(),
        )
        self.lifecycle.open()

    async def close(self) -> None:
        if self.lifecycle.close() is LifecycleState.CLOSED:
            return
        try:
            for stream in list(self.streams):
                await stream.aclose()
        finally:
            session, self._session = self._session, None
            if session is not None:
                await session.close()

    def session(self, op: Operation) -> aiohttp.ClientSession:
        if self._session is None or self.state is not LifecycleState.OPEN:
            hint = "use 'async with Client(...)'" if self.state is LifecycleState.UNOPENED else ""
            raise ClientError(
                "closed",
                f"the client is {self.state.value}; {hint}".rstrip("; "),
                operation=op.id,
            )
        return self._session

    # -- one request ----------------------------------------------------------------------------

    def deadline(self, options: CallOptions | None) -> float | None:
        timeout = self.timeout if options is None or options.timeout is None else options.timeout
        return None if timeout is None or math.isinf(timeout) else timeout

    async def send(
        self,
        op: Operation,
        *,
        path_params: Mapping[str, str],
        query: object,
        body: object,
        options: CallOptions | None,
        accept: str,
        headers: Mapping[str, str] | None = None,
    ) -> aiohttp.ClientResponse:
        """Send the request and return the response once its headers are in.

        The caller owns the response and must close or release it.
        """
        session = self.session(op)
        request_headers = {"Accept": accept, **(headers or {})}
        if options is not None and options.headers:
            request_headers.update(options.headers)
        data: bytes | None = None
        if op.body is not None:
            data = codec.dumps(body if body is not None else {})
            request_headers.setdefault("Content-Type", _JSON)
        try:
            return await session.request(
                op.method,
                self.url(op, path_params),
                params=_query_params(query),
                data=data,
                headers=request_headers,
                allow_redirects=False,
            )
        except aiohttp.ClientError as exc:
            raise transport_error(op, exc) from exc

    def url(self, op: Operation, path_params: Mapping[str, str]) -> URL:
        missing = set(op.path_params) - set(path_params)
        if missing:
            raise TypeError(f"{op.id}: missing path parameters {sorted(missing)}")
        path = op.url(**{k: quote(v, safe="") for k, v in path_params.items()})
        return self.base_url.with_path(self.base_url.raw_path.rstrip("/") + path, encoded=True)


def transport_error(op: Operation, exc: BaseException) -> ClientError:
    if isinstance(exc, TimeoutError):
        return ClientError("transport", f"{op.id}: timed out", operation=op.id)
    detail = str(exc) or type(exc).__name__
    return ClientError("transport", f"{op.id}: {detail}", operation=op.id)


def _query_params(query: object) -> list[tuple[str, str]]:
    if query is None:
        return []
    params: list[tuple[str, str]] = []
    for name, value in codec.to_json(query).items():
        if isinstance(value, bool):
            params.append((name, "true" if value else "false"))
        elif isinstance(value, str | int | float):
            params.append((name, str(value)))
        else:
            raise TypeError(f"query member {name!r} is not a scalar: {value!r}")
    return params


# -- reading answers ----------------------------------------------------------------------------


async def read_failure(op: Operation, response: aiohttp.ClientResponse) -> Exception:
    """The exception for a response that is not the operation's success."""
    body = await read_body(op, response)
    if response.content_type == _JSON:
        try:
            value = orjson.loads(body)
        except orjson.JSONDecodeError:
            value = None
        if isinstance(value, dict) and (error := errors.from_wire(value)) is not None:
            return error
    return ClientError(
        "unexpected_status",
        f"{op.id}: HTTP {response.status} ({response.content_type}): {_snippet(body)}",
        status=response.status,
        operation=op.id,
    )


async def read_body(op: Operation, response: aiohttp.ClientResponse) -> bytes:
    try:
        return await response.read()
    except aiohttp.ClientError as exc:
        raise transport_error(op, exc) from exc


async def read_success(op: Operation, response: aiohttp.ClientResponse) -> Any:
    """Decode a 2xx answer according to the operation's output kind."""
    if op.output_kind == "no_content":
        await read_body(op, response)
        return None
    if response.status == 204:
        raise ClientError(
            "unexpected_status",
            f"{op.id}: HTTP 204 where a body was expected",
            status=204,
            operation=op.id,
        )
    body = await read_body(op, response)
    if op.output_kind == "text":
        if response.content_type != "text/plain":
            raise ClientError(
                "unsupported_content_type",
                f"{op.id}: expected text/plain, got {response.content_type!r}: {_snippet(body)}",
                status=response.status,
                operation=op.id,
            )
        return body.decode(response.charset or "utf-8", errors="replace")
    if response.content_type != _JSON:
        raise ClientError(
            "unsupported_content_type",
            f"{op.id}: expected {_JSON}, got {response.content_type!r}: {_snippet(body)}",
            status=response.status,
            operation=op.id,
        )
    try:
        return decode_output(op, orjson.loads(body))
    except (orjson.JSONDecodeError, errors.InvalidRequestError, _ShapeError) as exc:
        raise ClientError(
            "malformed_response",
            f"{op.id}: {exc}: {_snippet(body)}",
            status=response.status,
            operation=op.id,
        ) from None


class _ShapeError(ValueError):
    pass


def decode_output(op: Operation, value: Any) -> Any:
    if op.output_kind == "raw":
        return decode(op.output, value, "")
    if not isinstance(value, dict) or "data" not in value:
        raise _ShapeError('expected an object with a "data" member')
    data = value["data"]
    if op.output_kind == "data":
        return decode(op.output, data, "data")
    if not isinstance(data, list):
        raise _ShapeError('"data" must be an array')
    items = tuple(decode(op.output, item, f"data[{i}]") for i, item in enumerate(data))
    if op.output_kind == "items":
        return items
    if op.output_kind == "page":
        cursor = codec.from_json(PageCursor, value.get("cursor") or {}, path="cursor")
        return Page(data=items, cursor=cursor)
    raise TypeError(f"{op.id}: output kind {op.output_kind!r} has no body to decode")


def decode(tp: Any, value: Any, path: str) -> Any:
    # The codec keeps a Mapping member as plain JSON; an output Mapping[str, <attrs>]
    # (session.active) wants its values decoded too.
    if typing.get_origin(tp) in (dict, collections.abc.Mapping):
        args = typing.get_args(tp)
        if len(args) == 2 and attrs.has(args[1]):
            if not isinstance(value, dict):
                raise _ShapeError(f"{path or 'body'} must be an object")
            return {k: codec.from_json(args[1], v, path=f"{path}.{k}") for k, v in value.items()}
    return codec.from_json(tp, value, path=path)


def _snippet(body: bytes) -> str:
    text = body[:_SNIPPET].decode("utf-8", "replace")
    return repr(text + ("…" if len(body) > _SNIPPET else ""))
