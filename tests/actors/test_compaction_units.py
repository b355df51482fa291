"""The estimator and the tail selection on plain values (no store, no model)."""

from __future__ import annotations

import attrs

from actors.llm import SCRIPTED_MODEL, ModelRequest
from actors.session.compaction import Estimator, select_tail, serialize
from protocol.shapes import (
    AssistantMessage,
    CacheTokens,
    CompactionMessage,
    MessageTime,
    ModelRef,
    SessionMessage,
    TextPart,
    Tokens,
    ToolPart,
    UserMessage,
)

T = MessageTime(created=0, updated=0)
REQUEST = ModelRequest(session_id="ses_a", agent="build", model=SCRIPTED_MODEL, system=("sys",))


def user(n: int, text: str) -> UserMessage:
    return UserMessage(id=f"msg_u{n}", session_id="ses_a", seq=n, time=T, text=text)


def reply(n: int, text: str, tokens: Tokens | None = None) -> AssistantMessage:
    return AssistantMessage(
        id=f"msg_a{n}",
        session_id="ses_a",
        seq=n,
        time=T,
        parts=(TextPart(ordinal=0, text=text),),
        finish="stop",
        tokens=tokens,
    )


def test_the_incremental_estimate_equals_a_count_from_scratch() -> None:
    history: list[SessionMessage] = []
    warm = Estimator()
    for n in range(0, 60, 2):
        history += [user(n, "q" * (n + 10)), reply(n + 1, "a" * 40)]
        assert warm.estimate(history, REQUEST) == Estimator().estimate(list(history), REQUEST)
    # A changed message in the middle is counted again, not served stale.
    history[10] = user(10, "z" * 4000)
    assert warm.estimate(history, REQUEST) == Estimator().estimate(list(history), REQUEST)
    # A shorter history (a revert, a compaction) too.
    assert warm.estimate(history[:7], REQUEST) == Estimator().estimate(history[:7], REQUEST)


def test_the_estimate_anchors_on_the_newest_reported_step() -> None:
    reported = Tokens(input=1000, output=10, reasoning=5, cache=CacheTokens(read=7, write=3))
    tool = ToolPart(
        id="c", name="read", status="completed", content=({"type": "text", "text": "r" * 400},)
    )
    anchor = attrs.evolve(reply(3, "a", reported), parts=(tool,))
    history = [user(0, "x" * 4000), reply(1, "b"), user(2, "y"), anchor, user(4, "w" * 40)]
    # Reported 1,025 + the anchor's tool result (100) + the prompt after it (10).
    assert Estimator().estimate(history, REQUEST) == 1025 + 100 + 10
    assert Estimator().estimate(history, REQUEST, anchor=False) > 1000 + 100
    failed = attrs.evolve(anchor, error={"type": "x", "message": "y"})
    # A failed step is no anchor: everything is counted.
    counted = [*history[:3], failed]
    assert Estimator().estimate(counted, REQUEST) == Estimator().estimate(
        counted, REQUEST, anchor=False
    )


def test_the_tail_is_bounded_and_starts_at_a_user_message() -> None:
    history: list[SessionMessage] = []
    for n in range(0, 20, 2):
        history += [user(n, "q" * 400), reply(n + 1, "a" * 400)]
    estimator = Estimator()
    start = select_tail(history, 250, estimator.message)
    assert start is not None
    assert isinstance(history[start], UserMessage)
    assert sum(estimator.message(m) for m in history[start:]) <= 250
    # Everything fits: only the latest exchange is kept, the rest is summarized.
    assert select_tail(history, 10**6, estimator.message) == len(history) - 2
    # A lone exchange (after an earlier checkpoint) has nothing older to summarize.
    checkpoint = CompactionMessage(
        id="msg_c", session_id="ses_a", seq=0, time=T, status="completed", reason="auto", text="s"
    )
    assert select_tail([checkpoint, user(1, "q"), reply(2, "a")], 100, estimator.message) is None
    assert select_tail([user(1, "q"), reply(2, "a")], 100, estimator.message) is None


def test_serialized_tool_results_are_cut() -> None:
    tool = ToolPart(
        id="c", name="read", status="completed", content=({"type": "text", "text": "r" * 5000},)
    )
    text = serialize([attrs.evolve(reply(1, "a"), parts=(tool,))])
    assert text.endswith("r" * 10 + "[truncated]")
    assert len(text) < 2100


def test_the_ceiling_reserves_output_and_buffer() -> None:
    from actors.llm import ModelLimits
    from actors.session.compaction import CompactionSettings, Compactor

    limits = {
        "big": ModelLimits(context=200_000, output=64_000),
        "tiny": ModelLimits(context=1000, output=100),
    }

    def compactor(buffer: int) -> Compactor:
        return Compactor(
            store=None,  # type: ignore[arg-type]
            bus=None,  # type: ignore[arg-type]
            providers=None,  # type: ignore[arg-type]
            retry=None,  # type: ignore[arg-type]
            limits=lambda m: limits.get(m.id),
            settings=CompactionSettings(buffer=buffer),
        )

    def ref(model: str) -> ModelRef:
        return ModelRef(id=model, provider_id="p")

    # The output reserve is capped at 32,000; the buffer wins when larger.
    assert compactor(20_000).ceiling(ref("big")) == 200_000 - 32_000
    assert compactor(50_000).ceiling(ref("big")) == 150_000
    # A window smaller than the buffer reserves only the output.
    assert compactor(20_000).ceiling(ref("tiny")) == 900
    assert compactor(20_000).ceiling(ref("unknown")) is None


def test_a_control_item_is_due_only_when_nothing_may_deliver_before_it() -> None:
    from actors.session.inbox import control_head, select_promotable
    from protocol.shapes import InboxItem

    def item(n: int, type_: str, delivery: str) -> InboxItem:
        return InboxItem(
            id=f"msg_{n}",
            session_id="ses_a",
            type=type_,  # type: ignore[arg-type]
            delivery=delivery,  # type: ignore[arg-type]
            time_created=n,
            payload={},
        )

    steer, queued = item(1, "user", "steer"), item(2, "user", "queue")
    compaction, queued_compaction = item(3, "compaction", "steer"), item(4, "compaction", "queue")
    # A steer ahead delivers first; promotion stops before the control item.
    assert control_head([steer, compaction], "steer") is None
    assert select_promotable([steer, compaction, item(5, "user", "steer")], "steer") == [steer]
    # Behind queued input only, a steered control item is due at any boundary.
    assert control_head([queued, compaction], "steer") is compaction
    assert control_head([compaction, steer], "steer") is compaction
    # A queued one waits for the idle boundary, at the head, with no steer pending.
    assert control_head([queued_compaction], "steer") is None
    assert control_head([queued_compaction], "input") is queued_compaction
    assert control_head([queued, queued_compaction], "input") is None
    # A steer behind it does not hold it back: the control item is a boundary.
    assert control_head([queued_compaction, item(6, "user", "steer")], "input") is (
        queued_compaction
    )
    assert select_promotable([queued_compaction, item(6, "user", "steer")], "input") == []
    # Held input (behind a staged revert) is not there at all.
    held = item(8, "synthetic", "steer")
    assert select_promotable([held, queued], "input", {held.id}) == [queued]
    assert control_head([held, queued_compaction], "input", {held.id}) is queued_compaction
    move = item(7, "move", "steer")
    assert control_head([move], "steer") is move
    assert control_head([], "input") is None
