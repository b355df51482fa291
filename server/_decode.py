"""Turning an aiohttp request into an operation's validated inputs.

Path parameters are checked against their id prefix, query strings are
coerced to the query class's field types (``limit=abc`` or ``order=sideways``
is a 400 naming the parameter), and bodies are decoded by the one codec. Any
failure is an :class:`~protocol.errors.InvalidRequestError`; nothing here can
produce a 500.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import types
import typing
from collections.abc import Awaitable, Callable
from typing import Any, Final

import attrs
import orjson
from aiohttp import web

from protocol import codec, ids
from protocol.errors import InvalidRequestError, RequestTimeoutError
from protocol.operations import Operation

__all__ = ["decode_body", "decode_path", "decode_query", "loads_in_pieces"]

#: Runs a blocking callable off the loop (the runtime's BlockingExecutor).
Blocking = Callable[..., Awaitable[Any]]

_INT: Final = re.compile(r"-?\d{1,18}")
_TRUE: Final = frozenset({"true", "1"})
_FALSE: Final = frozenset({"false", "0"})


#: A path parameter's check: its name, its id kind, or else its compiled pattern.
_PathParam = tuple[str, ids.IdKind | None, re.Pattern[str] | None]
#: Each operation path's parameters, worked out once (``Operation.path_params``
#: runs a regex over the path): bounded by the operation table's paths.
_PATH_PLANS: Final[dict[str, tuple[_PathParam, ...]]] = {}


def _path_plan(op: Operation) -> tuple[_PathParam, ...]:
    plan = _PATH_PLANS.get(op.path)
    if plan is None:
        params = []
        for name in op.path_params:
            kind = op.id_kind(name)
            params.append((name, kind, None if kind is not None else re.compile(op.pattern(name))))
        plan = _PATH_PLANS[op.path] = tuple(params)
    return plan


def decode_path(op: Operation, request: web.Request) -> dict[str, str]:
    out: dict[str, str] = {}
    match_info = request.match_info
    for name, kind, pattern in _path_plan(op):
        raw = match_info[name]
        if kind is not None:
            out[name] = ids.validate(kind, raw, field=name)
        elif pattern is not None and pattern.fullmatch(raw):
            out[name] = raw
        else:
            raise InvalidRequestError(
                f"{name} must match {op.pattern(name)}", kind="path", field=name
            )
    return out


#: Each query class's fields as (name, wire name, type), worked out once
#: (type hints are slow to resolve): bounded by the operation table's classes.
_QUERY_PLANS: Final[dict[type[Any], tuple[tuple[str, str, Any], ...]]] = {}


def _query_plan(cls: type[Any]) -> tuple[tuple[str, str, Any], ...]:
    plan = _QUERY_PLANS.get(cls)
    if plan is None:
        hints = typing.get_type_hints(cls)
        plan = _QUERY_PLANS[cls] = tuple(
            (f.name, f.metadata.get("wire", codec.wire_name(f.name)), hints[f.name])
            for f in attrs.fields(cls)
        )
    return plan


def decode_query(op: Operation, request: web.Request) -> Any:
    if op.query is None:
        return None
    query = request.query
    values: dict[str, Any] = {}
    for name, wire, hint in _query_plan(op.query):
        raw = query.get(wire)
        if raw is None:
            continue
        values[name] = _coerce(hint, raw, wire)
    try:
        return op.query(**values)
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(f"invalid query: {exc}", kind="query") from None


def _coerce(tp: Any, raw: str, name: str) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = options[0]
    if tp is int:
        if not _INT.fullmatch(raw):
            raise InvalidRequestError(f"{name} must be an integer", kind="query", field=name)
        return int(raw)
    if tp is bool:
        lowered = raw.lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise InvalidRequestError(f"{name} must be true or false", kind="query", field=name)
    if typing.get_origin(tp) is typing.Literal:
        allowed = typing.get_args(tp)
        if raw not in allowed:
            raise InvalidRequestError(
                f"{name} must be one of {', '.join(allowed)}", kind="query", field=name
            )
        return raw
    return raw


async def decode_body(
    op: Operation, request: web.Request, timeout_s: float, max_bytes: int, blocking: Blocking
) -> Any:
    """The body, read within ``timeout_s``: one shorter than its Content-Length is a 408.

    An operation with ``large_body`` gets the JSON value, parsed on a thread
    in pieces (:func:`loads_in_pieces`); its handler decodes and checks it.
    """
    if op.body is None:
        return None
    raw = _buffered(request, max_bytes)
    if raw is None:
        try:
            async with asyncio.timeout(timeout_s):
                raw = await _read(request, max_bytes)
        except TimeoutError:
            raise RequestTimeoutError(
                f"The request body did not arrive within {timeout_s:g} s"
            ) from None
    if op.large_body:
        return await blocking(loads_in_pieces, raw) if raw else {}
    # Only an empty body is no body; whitespace alone is not a JSON document.
    if not raw:
        data: Any = {}
    else:
        data = codec.loads(raw)
    if op.id == "session.prompt" and isinstance(data, dict):
        data = _flatten_prompt(data)
    return codec.from_json(op.body, data, strict=True)


def _buffered(request: web.Request, max_bytes: int) -> bytes | None:
    """The whole body when it has all arrived already (a small body usually comes
    with its headers), else None: no timeout to arm, no chunks to wait for."""
    content = request.content
    if not content.is_eof():
        return None
    declared = request.content_length
    if declared is not None and declared > max_bytes:
        raise web.HTTPRequestEntityTooLarge(max_size=max_bytes, actual_size=declared)
    raw = content.read_nowait()
    if len(raw) > max_bytes:
        raise web.HTTPRequestEntityTooLarge(max_size=max_bytes, actual_size=len(raw))
    return raw


async def _read(request: web.Request, max_bytes: int) -> bytes:
    """The whole body, not kept on the request (``request.read()`` caches it there).

    aiohttp's connection loop holds the last request of a keep-alive
    connection until the next one arrives, so a cached body would stay
    resident for as long as its client stays idle. Over ``max_bytes`` this
    raises HTTPRequestEntityTooLarge like ``read()``; the app's error
    middleware answers it with the real limit.
    """
    declared = request.content_length
    if declared is not None and declared > max_bytes:
        raise web.HTTPRequestEntityTooLarge(max_size=max_bytes, actual_size=declared)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > max_bytes:
            raise web.HTTPRequestEntityTooLarge(max_size=max_bytes, actual_size=size)
        chunks.append(chunk)
    return b"".join(chunks)


_NESTED_PROMPT: Final = ("text", "files")


def _flatten_prompt(data: dict[str, Any]) -> dict[str, Any]:
    """Accept the released v2 client's nested ``{"prompt": {"text", "files"}}`` body.

    That nesting is the one documented compatibility alias (reference/wire.md);
    a member of it other than ``text``/``files`` is refused like any unknown
    field, by its full path.
    """
    nested = data.get("prompt")
    if not isinstance(nested, dict):
        return data
    for key in nested:
        if key not in _NESTED_PROMPT:
            raise InvalidRequestError(
                f"unknown field prompt.{key}", kind="unknown", field=f"prompt.{key}"
            )
    flat = {k: v for k, v in data.items() if k != "prompt"}
    for key in _NESTED_PROMPT:
        if key in nested and key not in flat:
            flat[key] = nested[key]
    return flat


# -- large bodies ------------------------------------------------------------------------------

_WS: Final = re.compile(r"[ \t\n\r]*")
#: Objects and arrays this deep are walked member by member; deeper values are
#: parsed whole (an import's messages are at depth 2: each one C call).
_WALKED: Final = 2


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is not finite")
    return value


_SCANNER: Final = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite)


def loads_in_pieces(raw: bytes) -> Any:
    """What :func:`protocol.codec.loads` makes of ``raw``, parsed in short C calls.

    A 32 MiB import parsed by one ``orjson.loads`` holds the GIL for most of a
    second, and a thread running it stalls the event loop as much as the loop
    running it itself. Here the top two levels are walked in Python and each
    value below them (an import's message) is one call of the standard JSON
    scanner, so the GIL changes hands between them. Refused like orjson
    refuses: NaN, infinite numbers, lone surrogates (checked per piece by
    orjson itself), trailing data: a 400 of kind ``json``.
    """
    try:
        text = raw.decode("utf-8")
        value, end = _value(text, _WS.match(text, 0).end(), 0)  # type: ignore[union-attr]
        if _WS.match(text, end).end() != len(text):  # type: ignore[union-attr]
            raise ValueError(f"extra data at character {end}")
    except (ValueError, RecursionError, orjson.JSONEncodeError) as exc:
        raise InvalidRequestError(f"Malformed JSON: {exc}", kind="json") from None
    return value


def _value(text: str, at: int, depth: int) -> tuple[Any, int]:
    head = text[at : at + 1]
    if depth < _WALKED and head in ("{", "["):
        return _walk(text, at, depth)
    value, end = _SCANNER.raw_decode(text, at)
    orjson.dumps(value)  # lone surrogates: what the store could not write
    return value, end


def _walk(text: str, at: int, depth: int) -> tuple[Any, int]:
    """The object or array at ``at``, its members parsed one by one."""
    is_object = text[at] == "{"
    close = "}" if is_object else "]"
    out_obj: dict[str, Any] = {}
    out_list: list[Any] = []
    i = _skip(text, at + 1)
    if text[i : i + 1] == close:
        return (out_obj if is_object else out_list), i + 1
    while True:
        if is_object:
            if text[i : i + 1] != '"':
                raise ValueError(f"expected a member name at character {i}")
            key, i = _SCANNER.raw_decode(text, i)
            i = _skip(text, i)
            if text[i : i + 1] != ":":
                raise ValueError(f"expected ':' at character {i}")
            item, i = _value(text, _skip(text, i + 1), depth + 1)
            out_obj[key] = item
        else:
            item, i = _value(text, i, depth + 1)
            out_list.append(item)
        i = _skip(text, i)
        sep = text[i : i + 1]
        if sep == close:
            return (out_obj if is_object else out_list), i + 1
        if sep != ",":
            raise ValueError(f"expected ',' or {close!r} at character {i}")
        i = _skip(text, i + 1)


def _skip(text: str, at: int) -> int:
    return _WS.match(text, at).end()  # type: ignore[union-attr]
