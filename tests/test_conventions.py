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
