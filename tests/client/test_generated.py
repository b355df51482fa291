"""The generated client is the operation table's, method for method, and cannot drift."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
from scripts_loader import load_script

from protocol import _generated_client as generated
from protocol.client import Client, EventStream
from protocol.operations import OPERATIONS, Operation

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_file_is_what_the_generator_writes() -> None:
    gen = load_script("gen_client")

    fresh = gen.render()

    assert fresh == (ROOT / "protocol" / "_generated_client.py").read_text(), (
        "protocol/_generated_client.py is stale: run .venv/bin/python scripts/gen_client.py"
    )
    assert gen.main(["--check"]) == 0


def calls_by_method() -> dict[tuple[str, str], list[str]]:
    """(class, method) -> ids of the operations its body passes to _call/_stream."""
    tree = ast.parse(inspect.getsource(generated))
    found: dict[tuple[str, str], list[str]] = {}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        for fn in cls.body:
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) or fn.name == "__init__":
                continue
            ops = []
            for node in ast.walk(fn):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("_call", "_stream")
                ):
                    first = node.args[0]
                    assert isinstance(first, ast.Name)
                    op = getattr(generated, first.id)
                    assert isinstance(op, Operation)
                    ops.append(op.id)
            found[(cls.name, fn.name)] = ops
    return found


def test_every_operation_has_exactly_one_client_method() -> None:
    calls = calls_by_method()
    client = Client("http://x")
    group_class = {op.client[0]: type(getattr(client, op.client[0])).__name__ for op in OPERATIONS}

    for op in OPERATIONS:
        group, name = op.client
        callers = sorted(m for m, ops in calls.items() if op.id in ops)
        expected = [(group_class[group], name)]
        if op.output_kind == "page":
            expected.append((group_class[group], f"{name}_next"))
        assert callers == sorted(expected), op.id
    # ... and every generated method calls exactly one operation.
    assert all(len(ops) == 1 for ops in calls.values())
    assert len({op.client for op in OPERATIONS}) == len(OPERATIONS)


def test_the_client_exposes_every_group() -> None:
    client = Client("http://x")
    for op in OPERATIONS:
        group, name = op.client
        assert callable(getattr(getattr(client, group), name))


@pytest.mark.parametrize("op", OPERATIONS, ids=lambda op: op.id)
def test_method_shape_follows_the_operation(op: Operation) -> None:
    group, name = op.client
    method = getattr(type(getattr(Client("http://x"), group)), name)
    params = list(inspect.signature(method).parameters.values())[1:]
    path = [p.name for p in params[: len(op.path_params)]]

    assert path == [p.replace("ID", "_id") for p in op.path_params]
    assert params[-1].name == "options"
    assert params[-1].kind is inspect.Parameter.KEYWORD_ONLY
    if op.streaming:
        assert not inspect.iscoroutinefunction(method)
        assert inspect.signature(method).return_annotation == EventStream.__name__
    else:
        assert inspect.iscoroutinefunction(method)
    if op.body is not None:
        assert "input" in inspect.signature(method).parameters
    if op.query is not None:
        assert "query" in inspect.signature(method).parameters
