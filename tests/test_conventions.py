"""Rules the code keeps that no linter checks for us."""

from __future__ import annotations

import ast
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("package", ["protocol", "storage", "actors", "server"])
def test_no_asyncio_wait_for(package: str) -> None:
    """``async with asyncio.timeout(...)`` instead: on Python 3.11, ``wait_for``
    returns normally when its awaitable completes as a cancellation arrives, so
    the cancelled task runs on (the lease scan did, and a closing runtime waited
    for it forever; ``tests/runtime/test_hosts.py``)."""
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "wait_for"
                and isinstance(node.value, ast.Name)
                and node.value.id == "asyncio"
            ):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            elif isinstance(node, ast.ImportFrom) and node.module == "asyncio":
                bad += [
                    f"{path.relative_to(ROOT)}:{node.lineno}"
                    for a in node.names
                    if a.name == "wait_for"
                ]
    assert bad == []


def test_the_leak_check_still_sees_what_a_test_drops_after_the_freeze() -> None:
    """Collection's objects are frozen (tests/conftest.py), so ``loop_hygiene``'s
    full collection skips them; a future a test drops inside a cycle is still
    collected and reported as never retrieved."""
    import asyncio
    import gc

    assert gc.get_freeze_count() > 0
    loop = asyncio.new_event_loop()
    reported: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        future = loop.create_future()
        future.set_exception(RuntimeError("dropped"))
        cycle: list[object] = [future]
        cycle.append(cycle)
        del future, cycle
        gc.collect()
    finally:
        loop.close()
    assert [c["message"] for c in reported] == ["Future exception was never retrieved"]


def test_what_a_session_leader_started_is_killed_once_the_leader_is_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """However a run ends, ``reap_all`` (tests/conftest.py) kills what the tests' children
    left: here a harness that exited with its server still running, orphaned."""
    import subprocess

    import proc_groups

    monkeypatch.setattr(proc_groups, "_spawned", [])  # this test's children alone
    harness = subprocess.Popen(
        ["/bin/sh", "-c", "sleep 600 & echo $!"], stdout=subprocess.PIPE, start_new_session=True
    )
    assert harness.stdout is not None
    server = int(harness.stdout.readline())
    harness.wait()
    harness.stdout.close()
    assert proc_groups.alive(server)  # orphaned, under init now
    assert proc_groups.reap_all() == [server]
    deadline = time.monotonic() + 10  # a poll: SIGKILL lands asynchronously
    while proc_groups.alive(server) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not proc_groups.alive(server)


#: Positive sleeps left outside a poll loop, each for a reason of its own (a
#: simulated delay or pause is what the test is about; a sleep that is cancelled
#: is never waited out). Anything new here waits on an event, a sequencer, loop
#: turns (tests/loop_turns.py) or a clock the test advances (tests/manual_clock.py).
SLEEPS_ALLOWED = {
    "tests/llm/fake_providers.py",  # a slow network, simulated, when a reply asks for one
    "tests/runtime/test_hosts_sim.py",  # random pauses of a randomized simulation
    "tests/mcp/mcp_server.py",  # a slow or stuck MCP tool, cancelled or killed, never waited out
}


_FUNCTION = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_LOOP = (ast.While, ast.For, ast.AsyncFor)
#: Context managers that bound what they enclose (asyncio's, anyio's).
_DEADLINES = frozenset({"timeout", "timeout_at", "fail_after", "move_on_after"})
#: Names that, in a ``while`` loop's condition or body, bound it by the clock.
_DEADLINE_WORDS = ("deadline", "monotonic", "timeout")


def _called(node: ast.AST) -> str | None:
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def _positive_sleeps(tree: ast.AST) -> list[ast.Call]:
    found = []
    for node in ast.walk(tree):
        if _called(node) != "sleep" or not node.args:  # type: ignore[attr-defined]
            continue
        assert isinstance(node, ast.Call)
        first = node.args[0]
        if isinstance(first, ast.Constant) and first.value == 0:
            continue
        receiver = node.func.value if isinstance(node.func, ast.Attribute) else None
        if isinstance(receiver, ast.Name) and receiver.id == "clock":
            continue  # a wait on the test's ManualClock: it ends when the test advances it
        found.append(node)
    return found


def _bounded(loop: ast.AST, enclosing: list[ast.AST]) -> bool:
    """Whether ``loop`` ends by itself: a ``for`` over ``range(...)``, a loop under
    a deadline's context manager (in the same function), or a loop whose
    condition or body reads a deadline, the monotonic clock or a timeout."""
    if isinstance(loop, ast.For) and _called(loop.iter) == "range":
        return True
    for outer in enclosing:
        if isinstance(outer, ast.With | ast.AsyncWith) and any(
            _called(item.context_expr) in _DEADLINES for item in outer.items
        ):
            return True
    if isinstance(loop, ast.While):
        text = ast.unparse(loop)
        return any(word in text for word in _DEADLINE_WORDS)
    return False


def _unbounded_sleeps(tree: ast.AST) -> tuple[list[int], list[int]]:
    """The lines of positive sleeps outside any loop (in their own function), and of
    those in a loop that nothing bounds: a poll must end, by a deadline or a count."""
    sleeps = _positive_sleeps(tree)
    if not sleeps:
        return [], []
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    outside, unbounded = [], []
    for sleep in sleeps:
        chain, up = [], parents.get(sleep)
        while up is not None and not isinstance(up, _FUNCTION):
            chain.append(up)
            up = parents.get(up)
        loops = [i for i, node in enumerate(chain) if isinstance(node, _LOOP)]
        if not loops:
            outside.append(sleep.lineno)
        elif not _bounded(chain[loops[0]], chain[loops[0] + 1 :]):
            unbounded.append(sleep.lineno)
    return outside, unbounded


def test_tests_wait_on_conditions_not_on_the_clock() -> None:
    """No positive sleep outside a loop that polls for a condition, no poll without
    a deadline or a bound on its turns, and no assertion on how long something
    took: on a loaded machine each fails, hangs or passes for no reason."""
    sleeps, polls, timed = [], [], []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        name = str(path.relative_to(ROOT))
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=name)
        outside, unbounded = _unbounded_sleeps(tree)
        if name not in SLEEPS_ALLOWED:
            sleeps += [f"{name}:{line}" for line in outside]
        polls += [f"{name}:{line}" for line in unbounded]
        for node in ast.walk(tree):
            if isinstance(node, ast.Assert) and any(
                isinstance(c, ast.Compare) and any(isinstance(o, ast.Lt | ast.LtE) for o in c.ops)
                for c in ast.walk(node.test)
            ):
                text = ast.unparse(node.test)
                if "elapsed" in text or "monotonic()" in text or "perf_counter()" in text:
                    timed.append(f"{name}:{node.lineno}")
    assert sleeps == []
    assert polls == []
    assert timed == []


def test_the_sleep_check_sees_what_it_forbids() -> None:
    code = """
async def f(done, clock):
    await asyncio.sleep(1)                      # 3: outside a loop
    while not done():
        await asyncio.sleep(0.01)               # 5: a poll that never gives up
    for _ in itertools.count():
        await asyncio.sleep(0.01)               # 7: the same
    async with asyncio.timeout(5):
        while not done():
            await asyncio.sleep(0.01)           # bounded by the timeout
    for _ in range(100):
        await asyncio.sleep(0.01)               # bounded by the count
    deadline = time.monotonic() + 5
    while not done() and time.monotonic() < deadline:
        time.sleep(0.01)                        # bounded by the deadline
    while not done():
        def later():
            time.sleep(1)                       # 18: in a function of its own, outside a loop
    await clock.sleep(5)                        # the test's ManualClock
    await asyncio.sleep(0)                      # a turn of the loop
"""
    assert _unbounded_sleeps(ast.parse(code)) == ([3, 18], [5, 7])


def _store_writes(tree: ast.AST) -> list[tuple[int, str]]:
    """The ``...store.append()``/``submit()`` calls and ``Command`` imports in ``tree``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("storage"):
            found += [(node.lineno, "import Command") for a in node.names if a.name == "Command"]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("append", "submit")
            and ast.unparse(node.func.value).endswith("store")
        ):
            found.append((node.lineno, ast.unparse(node.func)))
    return found


def test_a_handler_never_appends_to_the_store() -> None:
    """Commands in, queries out: the server turns a command into a call whose
    write a session's actor makes (or the create/import path), never its own
    append. Nothing under server/ imports ``Command`` or calls a store's
    ``append``/``submit``."""
    bad = []
    for path in sorted((ROOT / "server").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        bad += [f"{path.relative_to(ROOT)}:{line} {what}" for line, what in _store_writes(tree)]
    assert bad == []
    # The check sees what it forbids.
    handler = (
        "from storage import Command\nasync def h(runtime):\n    await runtime.store.append(c)\n"
    )
    assert _store_writes(ast.parse(handler)) == [(1, "import Command"), (3, "runtime.store.append")]
