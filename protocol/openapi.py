"""The OpenAPI 3.1 document, derived from the operation table and the shapes.

JSON Schemas come from the attrs classes' type hints with the codec's wire
names, so the document cannot drift from what the server sends and accepts.
"""

from __future__ import annotations

import collections.abc
import types
import typing
from typing import Any, Final

import attrs

from protocol import codec
from protocol.errors import DomainError
from protocol.operations import OPERATIONS, Operation

__all__ = ["document", "schema_of"]

TITLE: Final = "sessionrt"
VERSION: Final = "0.1.0"


class _Schemas:
    def __init__(self) -> None:
        self.components: dict[str, Any] = {}

    def of(self, tp: Any) -> dict[str, Any]:
        if tp is Any:
            return {}
        if attrs.has(tp):
            name = tp.__name__
            if name not in self.components:
                self.components[name] = {}  # placeholder against recursion
                self.components[name] = self._object(tp)
            return {"$ref": f"#/components/schemas/{name}"}
        origin = typing.get_origin(tp)
        args = typing.get_args(tp)
        if origin in (typing.Union, types.UnionType):
            options = [a for a in args if a is not type(None)]
            if len(options) == 1:
                return self.of(options[0])
            return {"oneOf": [self.of(a) for a in options]}
        if origin is typing.Literal:
            return {"enum": list(args)}
        if origin is tuple:
            return {"type": "array", "items": self.of(args[0])}
        if origin in (dict, collections.abc.Mapping):
            value = args[1] if len(args) == 2 else Any
            return {"type": "object", "additionalProperties": self.of(value)}
        if tp in (dict, collections.abc.Mapping):
            return {"type": "object"}
        simple = {bool: "boolean", int: "integer", float: "number", str: "string"}
        if tp in simple:
            return {"type": simple[tp]}
        raise TypeError(f"openapi: no schema for {tp!r}")

    def _object(self, cls: type[Any]) -> dict[str, Any]:
        hints = typing.get_type_hints(cls)
        properties: dict[str, Any] = {}
        required = []
        for field in attrs.fields(cls):
            wire = field.metadata.get("wire", codec.wire_name(field.name))
            tp = hints[field.name]
            properties[wire] = field.metadata.get("schema") or self.of(tp)
            optional = typing.get_origin(tp) in (typing.Union, types.UnionType) and type(
                None
            ) in typing.get_args(tp)
            if field.default is attrs.NOTHING and not optional:
                required.append(wire)
            else:
                # The codec takes null for a member that may be left out: the same.
                properties[wire] = {"anyOf": [properties[wire], {"type": "null"}]}
        # Members a class does not declare are refused in requests (a 400 naming
        # them) and never sent in replies.
        schema: dict[str, Any] = {
            "type": "object",
            "properties": properties,
            "additionalProperties": False,
        }
        if required:
            schema["required"] = required
        if cls.__doc__:
            schema["description"] = cls.__doc__.strip().split("\n\n")[0]
        return schema


def schema_of(tp: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(schema, components) for a type, for callers outside the document."""
    schemas = _Schemas()
    return schemas.of(tp), schemas.components


def _error_schema(cls: type[DomainError]) -> dict[str, Any]:
    properties: dict[str, Any] = {
        "_tag": {"const": cls.tag},
        "message": {"type": "string"},
    }
    for name in cls.field_names:
        properties[name] = {"type": "integer"} if name.endswith("Bytes") else {"type": "string"}
    return {"type": "object", "properties": properties, "required": ["_tag", "message"]}


def _success(op: Operation, schemas: _Schemas) -> tuple[str, dict[str, Any]]:
    if op.output_kind == "no_content":
        return "204", {"description": "No content"}
    if op.output_kind == "sse":
        # Each frame: ``id`` (a durable event's seq), ``event`` (its type), ``data``
        # (the event envelope as JSON); comments keep the connection alive.
        frame = {
            "type": "object",
            "properties": {
                "id": {"type": "string"},
                "event": {"type": "string"},
                "data": {"type": "string", "contentMediaType": "application/json"},
                "retry": {"type": "integer"},
            },
            "required": ["data"],
        }
        return "200", {
            "description": "Server-sent events",
            "content": {"text/event-stream": {"schema": frame}},
        }
    if op.output_kind == "text":
        return "200", {
            "description": op.summary,
            "content": {"text/plain": {"schema": {"type": "string"}}},
        }
    item = schemas.of(op.output)
    if op.output_kind == "data":
        body = {"type": "object", "properties": {"data": item}, "required": ["data"]}
    elif op.output_kind == "items":
        body = {
            "type": "object",
            "properties": {"data": {"type": "array", "items": item}},
            "required": ["data"],
        }
    elif op.output_kind == "page":
        body = {
            "type": "object",
            "properties": {
                "data": {"type": "array", "items": item},
                "cursor": {
                    "type": "object",
                    "properties": {"previous": {"type": "string"}, "next": {"type": "string"}},
                },
            },
            "required": ["data", "cursor"],
        }
    else:
        body = item
    return "200", {"description": "Success", "content": {"application/json": {"schema": body}}}


def _parameters(op: Operation, schemas: _Schemas) -> list[dict[str, Any]]:
    params: list[dict[str, Any]] = [
        {
            "name": p,
            "in": "path",
            "required": True,
            "schema": {"type": "string", "pattern": op.pattern(p)},
        }
        for p in op.path_params
    ]
    if op.query is not None:
        hints = typing.get_type_hints(op.query)
        for field in attrs.fields(op.query):
            params.append(
                {
                    "name": field.metadata.get("wire", codec.wire_name(field.name)),
                    "in": "query",
                    "required": False,
                    "schema": field.metadata.get("schema") or schemas.of(hints[field.name]),
                }
            )
    return params


def document() -> dict[str, Any]:
    schemas = _Schemas()
    paths: dict[str, Any] = {}
    for op in OPERATIONS:
        status, success = _success(op, schemas)
        responses: dict[str, Any] = {status: success}
        by_status: dict[int, list[type[DomainError]]] = {}
        for cls in op.all_errors:
            by_status.setdefault(cls.status, []).append(cls)
        for code, classes in sorted(by_status.items()):
            options = [_error_schema(c) for c in classes]
            schema = options[0] if len(options) == 1 else {"oneOf": options}
            responses[str(code)] = {
                "description": ", ".join(c.tag for c in classes),
                "content": {"application/json": {"schema": schema}},
            }
        operation: dict[str, Any] = {
            "operationId": op.id,
            "summary": op.summary,
            "parameters": _parameters(op, schemas),
            "responses": responses,
        }
        if op.body is not None:
            operation["requestBody"] = {
                # An empty body is the empty object when no field is required.
                "required": any(f.default is attrs.NOTHING for f in attrs.fields(op.body)),
                "content": {"application/json": {"schema": schemas.of(op.body)}},
            }
        paths.setdefault(op.path, {})[op.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": TITLE, "version": VERSION},
        "paths": paths,
        "components": {
            "schemas": schemas.components,
            "securitySchemes": {
                "basic": {"type": "http", "scheme": "basic"},
                "bearer": {"type": "http", "scheme": "bearer"},
            },
        },
    }
