"""Registry, permission rules, and the executor: validation, errors, bounding, cancellation."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from actors import BlockingExecutor
from actors.tools import (
    CancelEvent,
    OutputBounding,
    SucceededThenInterrupted,
    ToolActors,
    ToolContext,
    ToolError,
    ToolExecutor,
    ToolOutcome,
    ToolRegistry,
    ToolResult,
    ToolSpec,
    builtin_tools,
    permission,
    text_item,
)

#: Only a guard: thread-side waits give up after this instead of hanging.
GUARD = 10.0

Run = Callable[[Mapping[str, Any], ToolContext], ToolResult]

SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {"n": {"type": "integer"}, "text": {"type": "string"}},
    "additionalProperties": False,
}


class FnTool:
    """A tool whose run is a test function; records every input it ran with."""

    description = "a test tool"

    def __init__(self, name: str, fn: Run, schema: Mapping[str, Any] = SCHEMA) -> None:
        self.name = name
        self.input_schema = schema
        self._fn = fn
        self.calls: list[Mapping[str, Any]] = []

    def run(self, input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        self.calls.append(input)
        return self._fn(input, ctx)


def echo(input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
    return ToolResult.text(str(input.get("text", "")))


def executor_for(runner: ToolActors, bounding: OutputBounding, *tools: FnTool) -> ToolExecutor:
    return ToolExecutor(ToolRegistry(tools), runner, bounding)


# -- registry ----------------------------------------------------------------------------------


def test_specs_list_every_tool_in_registration_order() -> None:
    registry = ToolRegistry(builtin_tools())
    specs = registry.specs()
    assert [s.name for s in specs] == ["read", "write", "edit", "list", "glob", "grep", "bash"]
    assert all(s.description and s.input_schema["type"] == "object" for s in specs)
    assert registry.specs(["bash", "nope"]) == (
        ToolSpec(
            name="bash",
            description=registry.lookup("bash").description,
            input_schema=registry.lookup("bash").input_schema,
        ),
    )
    assert "read" in registry
    assert len(registry) == 7


def test_offered_specs_follow_each_permission_table_and_later_registrations() -> None:
    registry = ToolRegistry(builtin_tools())
    plan = {"*": "allow", "write": "deny", "edit": "deny", "bash": "deny"}
    names = [s.name for s in registry.offered_specs(plan)]
    assert names == ["read", "list", "glob", "grep"]
    assert registry.offered_specs(plan) is registry.offered_specs(plan)  # kept
    # An equal table, another object: answered for itself, the same way.
    assert [s.name for s in registry.offered_specs(dict(plan))] == names
    ask = {"bash": {"*": "deny", "git *": "ask"}}
    assert [s.name for s in registry.offered_specs(ask)][-1] == "bash"
    assert [s.name for s in registry.offered_specs({"*": "deny"})] == []
    registry.register(FnTool("t", echo))
    assert [s.name for s in registry.offered_specs(plan)] == [*names, "t"]
    # Many tables: the kept answers are bounded, every answer still right.
    tables = [{"*": "allow", "read": "deny"} for _ in range(200)]
    assert {len(registry.offered_specs(t)) for t in tables} == {len(registry) - 1}


def test_registering_a_name_twice_is_refused() -> None:
    registry = ToolRegistry([FnTool("t", echo)])
    with pytest.raises(ValueError, match="already registered"):
        registry.register(FnTool("t", echo))


@pytest.mark.parametrize(
    "schema",
    [{"type": "string"}, {"type": "object", "properties": {"n": {"type": "nonsense"}}}],
)
def test_a_broken_schema_is_refused_at_registration(schema: Mapping[str, Any]) -> None:
    with pytest.raises(ValueError, match="input_schema"):
        ToolRegistry([FnTool("t", echo, schema)])


def test_lookup_of_an_unknown_name_raises_an_unknown_tool_error() -> None:
    with pytest.raises(ToolError) as raised:
        ToolRegistry().lookup("ghost")
    assert raised.value.type == "unknown-tool"
    assert ToolRegistry().get("ghost") is None


# -- permission --------------------------------------------------------------------------------


def test_permission_defaults_to_allow() -> None:
    assert permission({}, "bash") == "allow"


def test_permission_star_applies_to_every_tool() -> None:
    assert permission({"*": "deny"}, "bash") == "deny"


@pytest.mark.parametrize(("exact", "star"), [("allow", "deny"), ("deny", "allow")])
def test_an_exact_rule_wins_over_star(exact: Any, star: Any) -> None:
    assert permission({"*": star, "bash": exact}, "bash") == exact
    assert permission({"*": star, "bash": exact}, "read") == star


def test_a_malformed_rule_is_an_error() -> None:
    with pytest.raises(ValueError, match="allow"):
        permission({"bash": "maybe"}, "bash")  # type: ignore[dict-item]


# -- executor: refusals --------------------------------------------------------------------------


async def test_an_unknown_tool_fails(
    runner: ToolActors, bounding: OutputBounding, ctx: ToolContext
) -> None:
    outcome = await executor_for(runner, bounding).execute("ghost", {}, ctx)
    assert outcome.status == "failed"
    assert outcome.error is not None
    assert outcome.error["type"] == "unknown-tool"
    assert "ghost" in outcome.error["message"]


@pytest.mark.parametrize(
    ("input", "problem"),
    [
        ({"n": "three"}, "$.n: 'three' is not of type 'integer'"),
        ({"extra": 1}, "Additional properties are not allowed ('extra' was unexpected)"),
        ([1, 2], "[1, 2] is not of type 'object'"),
    ],
)
async def test_invalid_input_fails_without_running_the_tool(
    runner: ToolActors, bounding: OutputBounding, ctx: ToolContext, input: Any, problem: str
) -> None:
    tool = FnTool("t", echo)
    outcome = await executor_for(runner, bounding, tool).execute("t", input, ctx)
    assert outcome.status == "failed"
    assert outcome.error is not None
    assert outcome.error["type"] == "invalid-input"
    assert problem in outcome.error["message"]
    assert tool.calls == []


async def test_a_missing_required_property_is_named(
    executor: ToolExecutor, ctx: ToolContext
) -> None:
    outcome = await executor.execute("read", {}, ctx)
    assert outcome.error == {
        "type": "invalid-input",
        "message": "Invalid input for tool 'read': 'path' is a required property",
    }


async def test_a_preset_cancel_fails_the_call_without_running_it(
    runner: ToolActors, bounding: OutputBounding, make_ctx: Callable[..., ToolContext]
) -> None:
    tool = FnTool("t", echo)
    cancel = CancelEvent()
    cancel.set()
    outcome = await executor_for(runner, bounding, tool).execute("t", {}, make_ctx(cancel=cancel))
    assert outcome.error is not None
    assert outcome.error["type"] == "aborted"
    assert tool.calls == []


async def test_a_closed_actor_pool_fails_the_call_as_aborted(
    bounding: OutputBounding, blocking: BlockingExecutor, ctx: ToolContext
) -> None:
    runner = ToolActors(blocking=blocking, limit=1)
    async with runner:
        pass
    outcome = await executor_for(runner, bounding, FnTool("t", echo)).execute("t", {}, ctx)
    assert outcome.error is not None
    assert outcome.error["type"] == "aborted"


# -- executor: results and failures ------------------------------------------------------------


async def test_a_result_that_fits_is_marked_not_truncated(
    runner: ToolActors, bounding: OutputBounding, ctx: ToolContext
) -> None:
    outcome = await executor_for(runner, bounding, FnTool("t", echo)).execute(
        "t", {"text": "hi"}, ctx
    )
    assert outcome == ToolOutcome(
        status="success", content=[text_item("hi")], metadata={"truncated": False}
    )


async def test_a_large_result_is_bounded_and_saved_before_it_is_returned(
    runner: ToolActors, blocking: BlockingExecutor, output_dir: Path, ctx: ToolContext
) -> None:
    bounding = OutputBounding(output_dir=output_dir, max_lines=2)
    outcome = await executor_for(runner, bounding, FnTool("t", echo)).execute(
        "t", {"text": "1\n2\n3\n4"}, ctx
    )
    assert outcome.status == "success"
    assert outcome.metadata["truncated"] is True
    saved = await blocking.run(Path(outcome.metadata["outputPath"]).read_text)
    assert saved == "1\n2\n3\n4"
    assert outcome.content[0] == text_item("1")
    assert outcome.content[1]["text"].startswith("... 2 lines truncated; ")
    assert outcome.content[2] == text_item("4")


async def test_a_small_structured_only_result_is_shown_to_the_model_as_json(
    runner: ToolActors, bounding: OutputBounding, ctx: ToolContext
) -> None:
    value = {"matches": [{"path": "a.py", "line": 3}], "total": 1}
    tool = FnTool("t", lambda input, ctx: ToolResult(structured=value))
    outcome = await executor_for(runner, bounding, tool).execute("t", {}, ctx)
    assert outcome.status == "success"
    (preview,) = outcome.content
    assert json.loads(preview["text"]) == value
    assert outcome.metadata == {"truncated": False, "structured": value}


async def test_a_large_structured_only_result_gets_a_bounded_json_preview(
    runner: ToolActors, blocking: BlockingExecutor, output_dir: Path, ctx: ToolContext
) -> None:
    value = {"rows": [{"n": n, "name": f"row {n}"} for n in range(500)]}
    bounding = OutputBounding(output_dir=output_dir, max_lines=40, max_bytes=2_000)
    tool = FnTool("t", lambda input, ctx: ToolResult(structured=value))
    outcome = await executor_for(runner, bounding, tool).execute("t", {}, ctx)
    assert outcome.status == "success"
    head, marker, tail = (item["text"] for item in outcome.content)
    path = outcome.metadata["outputPath"]
    assert head.startswith('{\n  "rows": [')
    assert tail.endswith("]\n}")
    assert len((head + tail).encode()) <= 2_000
    assert len((head + "\n" + tail).split("\n")) <= 40
    assert marker.endswith(f"lines truncated; full content saved to {path} ...")
    # The whole JSON is in the managed file, and consumers get the value unchanged.
    saved = await blocking.run(Path(path).read_text)
    assert json.loads(saved) == value
    assert outcome.metadata["structured"] == value
    assert outcome.metadata["truncated"] is True


async def test_a_tool_error_becomes_a_failed_outcome_with_its_type(
    runner: ToolActors, bounding: OutputBounding, ctx: ToolContext
) -> None:
    def fail(input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        raise ToolError("no such thing", type="denied")

    outcome = await executor_for(runner, bounding, FnTool("t", fail)).execute("t", {}, ctx)
    assert outcome == ToolOutcome(
        status="failed", error={"type": "denied", "message": "no such thing"}
    )


async def test_an_unexpected_exception_becomes_a_tool_error(
    runner: ToolActors, bounding: OutputBounding, ctx: ToolContext
) -> None:
    def crash(input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        raise KeyError("boom")

    outcome = await executor_for(runner, bounding, FnTool("t", crash)).execute("t", {}, ctx)
    assert outcome.error == {"type": "tool.error", "message": "KeyError: 'boom'"}


# -- executor: cancellation ----------------------------------------------------------------------


def waits_for_cancel(started: Callable[[], object]) -> Run:
    def run(input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        started()
        if not ctx.cancel.wait(GUARD):
            return ToolResult.text("never cancelled")
        raise ToolError("stopped on request", type="aborted")

    return run


async def test_setting_ctx_cancel_returns_an_aborted_outcome(
    runner: ToolActors, bounding: OutputBounding, ctx: ToolContext
) -> None:
    tool = FnTool("t", waits_for_cancel(ctx.cancel.set))
    outcome = await executor_for(runner, bounding, tool).execute("t", {}, ctx)
    assert outcome.error == {"type": "aborted", "message": "stopped on request"}


async def test_cancelling_the_awaiting_task_sets_ctx_cancel_and_propagates(
    runner: ToolActors, bounding: OutputBounding, ctx: ToolContext
) -> None:
    loop = asyncio.get_running_loop()
    started = asyncio.Event()
    returned = threading.Event()

    def run(input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            return waits_for_cancel(lambda: loop.call_soon_threadsafe(started.set))(input, ctx)
        finally:
            returned.set()

    executor = executor_for(runner, bounding, FnTool("t", run))
    call = asyncio.create_task(executor.execute("t", {}, ctx))
    async with asyncio.timeout(GUARD):
        await started.wait()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert ctx.cancel.is_set()
    # The tool had returned before the cancellation reached us: nothing runs on.
    assert returned.is_set()


async def test_a_cancel_after_the_tool_returned_hands_back_the_bounded_success(
    runner: ToolActors, blocking: BlockingExecutor, output_dir: Path, ctx: ToolContext
) -> None:
    loop = asyncio.get_running_loop()
    call: list[asyncio.Task[ToolOutcome]] = []

    def succeed_then_interrupt(input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        # The tool's last act: queue the interrupt on the loop. The runner hands the
        # job's result back with its own call_soon_threadsafe, queued after this one,
        # so the cancellation always lands once the tool has succeeded and before
        # its success reaches the awaiting task.
        loop.call_soon_threadsafe(call[0].cancel)
        return ToolResult.text("1\n2\n3\n4")

    bounding = OutputBounding(output_dir=output_dir, max_lines=2)
    executor = executor_for(runner, bounding, FnTool("t", succeed_then_interrupt))
    call.append(asyncio.create_task(executor.execute("t", {}, ctx)))
    with pytest.raises(SucceededThenInterrupted) as late:
        await call[0]
    assert call[0].cancelled()  # still a cancellation: never swallowed
    outcome = late.value.outcome
    assert outcome.status == "success"
    # Bounding ran to the end inside the same region: the full text is saved.
    assert outcome.metadata["truncated"] is True
    saved = await blocking.run(Path(outcome.metadata["outputPath"]).read_text)
    assert saved == "1\n2\n3\n4"


# -- executor: concurrency -----------------------------------------------------------------------


async def test_twenty_calls_never_run_more_than_the_runner_limit(
    runner: ToolActors, bounding: OutputBounding, make_ctx: Callable[..., ToolContext]
) -> None:
    assert runner.limit == 4
    lock = threading.Lock()
    full = threading.Event()
    active = peak = 0

    def run(input: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
            if active == runner.limit:
                full.set()
        try:
            # Each call holds its thread until the limit is reached once, so the
            # first four are provably running together.
            assert full.wait(GUARD)
        finally:
            with lock:
                active -= 1
        return ToolResult.text(str(input["n"]))

    executor = executor_for(runner, bounding, FnTool("t", run))
    async with asyncio.timeout(GUARD), asyncio.TaskGroup() as group:
        calls = [
            group.create_task(executor.execute("t", {"n": n}, make_ctx(call_id=f"call_{n}")))
            for n in range(20)
        ]
    outcomes = [call.result() for call in calls]
    assert [o.content for o in outcomes] == [(text_item(str(n)),) for n in range(20)]
    assert peak == runner.limit
