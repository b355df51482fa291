"""The one open/closed lifecycle: opens once, refuses use when not open, closes once."""

from __future__ import annotations

import pytest

from protocol.lifecycle import Lifecycle, LifecycleState


class ThingClosedError(Exception):
    pass


def test_a_resource_opens_once_and_says_what_it_is() -> None:
    life = Lifecycle("thing", ThingClosedError)
    with pytest.raises(ThingClosedError, match=r"^thing is unopened$"):
        life.check_open()
    life.open()
    life.check_open()
    assert life.is_open
    with pytest.raises(ThingClosedError, match=r"^thing is open; it opens once$"):
        life.open()


def test_a_close_that_awaits_runs_once_and_a_use_meanwhile_sees_closing() -> None:
    life = Lifecycle("thing")
    life.open()
    assert life.begin_close() is True
    with pytest.raises(RuntimeError, match=r"^thing is closing$"):
        life.check_open()
    assert life.begin_close() is False
    life.closed()
    assert life.begin_close() is False
    with pytest.raises(RuntimeError, match="opens once"):
        life.open()


def test_a_one_step_close_answers_the_state_it_left() -> None:
    unopened, opened = Lifecycle("a"), Lifecycle("b")
    opened.open()
    assert unopened.close() is LifecycleState.UNOPENED
    assert opened.close() is LifecycleState.OPEN
    assert opened.close() is LifecycleState.CLOSED
    assert opened.state is LifecycleState.CLOSED
