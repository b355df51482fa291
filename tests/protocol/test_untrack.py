"""protocol.untrack: immutable values leave the cyclic collector, nothing else does."""

from __future__ import annotations

import gc
import weakref
from collections import namedtuple
from typing import Any

import attrs

from actors.session.history import ChatCache
from protocol.lru import ENTRY_OVERHEAD, ByteLRU
from protocol.shapes import (
    AssistantMessage,
    CacheTokens,
    MessageTime,
    ModelRef,
    TextPart,
    Tokens,
    ToolPart,
    UserMessage,
)
from protocol.untrack import MAX_DEPTH, untrack, untrack_dict, untrack_known, untrack_tail


def _assistant(**more: Any) -> AssistantMessage:
    return AssistantMessage(
        id="msg_a",
        session_id="ses_x",
        seq=1,
        time=MessageTime(created=1, updated=2),
        model=ModelRef(id="m", provider_id="p"),
        parts=(TextPart(ordinal=0, text="hello"),),
        tokens=Tokens(input=3, cache=CacheTokens(read=1)),
        **more,
    )


def test_a_frozen_message_and_everything_in_it_leave_the_collector() -> None:
    message = _assistant()
    pieces = [message, message.time, message.model, message.parts, message.parts[0]]
    pieces += [message.tokens, message.tokens.cache]  # type: ignore[union-attr]
    assert all(gc.is_tracked(p) for p in pieces)
    assert untrack(message) is True
    assert [p for p in pieces if gc.is_tracked(p)] == []
    assert untrack(message) is True  # again: nothing to do


def test_a_dict_of_atoms_is_fine_but_a_list_keeps_its_holders_tracked() -> None:
    plain = UserMessage(
        id="msg_u",
        session_id="ses_x",
        seq=0,
        time=MessageTime(created=0, updated=0),
        text="hi",
        metadata={"source": "cli", "n": 1},
    )
    assert untrack(plain) is True
    assert not gc.is_tracked(plain)
    # A tool call whose input holds a list: the list may still change, so the
    # part and the message (and the tuple between them) stay with the collector;
    # the rest of the message leaves it all the same.
    tool = ToolPart(id="call_1", name="read", status="running", input={"paths": ["a", "b"]})
    message = attrs.evolve(_assistant(), parts=(TextPart(ordinal=0, text="x"), tool))
    assert untrack(message) is False
    assert gc.is_tracked(message)
    assert gc.is_tracked(message.parts)
    assert gc.is_tracked(tool)
    assert not gc.is_tracked(message.parts[0])
    assert not gc.is_tracked(message.time)


def test_mutable_unslotted_and_tuple_subclass_values_stay_tracked() -> None:
    @attrs.define
    class Mutable:
        text: str

    @attrs.frozen(slots=False)
    class WithDict:
        text: str

    Pair = namedtuple("Pair", "a b")
    for value in (Mutable("x"), WithDict("x"), Pair("a", "b"), ["x"], ("x", ["y"])):
        assert untrack(value) is False, value
        assert gc.is_tracked(value), value


def test_an_untracked_value_is_still_freed_when_let_go() -> None:
    message = _assistant()
    assert untrack(message)
    gone = weakref.ref(message)
    part = weakref.ref(message.parts[0])
    del message
    assert gone() is None
    assert part() is None


def test_nesting_deeper_than_the_limit_stays_tracked() -> None:
    value: tuple[Any, ...] = (TextPart(ordinal=0, text="x"),)
    for _ in range(MAX_DEPTH + 5):
        value = (value, TextPart(ordinal=0, text="y"))
    assert untrack(value) is False
    assert gc.is_tracked(value)


def test_a_value_put_in_a_byte_lru_is_untracked() -> None:
    lru: ByteLRU[str, AssistantMessage] = ByteLRU(1 << 20)
    message = _assistant()
    lru.put(message.id, message, 100)
    assert not gc.is_tracked(message)
    assert lru.get(message.id) is message


def test_a_byte_lrus_dict_is_untracked_while_every_value_in_it_is() -> None:
    lru: ByteLRU[str, object] = ByteLRU(1 << 20)
    entries = lru._entries  # what a full pass would walk, entry by entry
    lru.put("a", _assistant(), 100)
    assert not gc.is_tracked(entries)
    lru.put("b", ["a list may change"], 100)  # a value the collector must see
    assert gc.is_tracked(entries)
    lru.put("c", _assistant(), 100)
    assert gc.is_tracked(entries)  # "b" is still held
    lru.discard("b")
    lru.put("d", _assistant(), 100)
    assert not gc.is_tracked(entries)
    small: ByteLRU[str, object] = ByteLRU(2 * (100 + ENTRY_OVERHEAD))
    small.put("b", ["evicted"], 100)
    small.put("x", _assistant(), 100)
    assert gc.is_tracked(small._entries)
    small.put("y", _assistant(), 100)  # "b" goes (least recently used)
    assert "b" not in small
    assert not gc.is_tracked(small._entries)


def test_a_byte_lru_keyed_by_other_than_strings_and_ints_stays_tracked() -> None:
    lru: ByteLRU[ModelRef, object] = ByteLRU(1 << 20)
    lru.put(ModelRef(id="m", provider_id="p"), _assistant(), 100)
    assert gc.is_tracked(lru._entries)


def test_untrack_dict_takes_a_dict_out_until_a_container_is_stored() -> None:
    mapping = {"a": _assistant()}
    assert untrack(mapping["a"])
    assert gc.is_tracked(mapping)
    untrack_dict(mapping)
    assert not gc.is_tracked(mapping)
    mapping["b"] = _assistant()  # CPython tracks it again itself
    assert gc.is_tracked(mapping)


def test_untrack_tail_walks_only_past_the_known_prefix() -> None:
    # The prefix is the caller's word: left tracked here, it is not looked at.
    prefix = [TextPart(ordinal=i, text="old") for i in range(3)]
    tail = [TextPart(ordinal=3, text="new")]
    items = tuple(prefix + tail)
    assert untrack_tail(items, 3) is True
    assert not gc.is_tracked(items)
    assert not gc.is_tracked(tail[0])
    assert all(gc.is_tracked(p) for p in prefix)
    # A tail that must stay tracked keeps the tuple tracked.
    mixed = (*prefix, ["a list"])
    assert untrack_tail(mixed, 3) is False
    assert gc.is_tracked(mixed)


def test_untrack_known_takes_a_tuple_of_ints_out_without_a_walk() -> None:
    sums = tuple(range(10**6, 10**6 + 50))
    assert gc.is_tracked(sums)  # CPython untracks it only at its next collection
    untrack_known(sums)
    assert not gc.is_tracked(sums)


def test_a_converted_history_is_untracked_step_after_step() -> None:
    """ChatCache walks only a step's new messages (the rest is the last step's,
    untracked already) and still leaves every tuple of its entry untracked."""
    cache = ChatCache()
    time = MessageTime(created=0, updated=0)
    history: list[UserMessage] = []
    for i in range(5):
        history.append(UserMessage(id=f"m{i}", session_id="ses_x", seq=i, time=time, text="t"))
        chat = cache.history(history)
        assert not gc.is_tracked(chat)
        assert not any(gc.is_tracked(m) for m in chat)
        assert not any(gc.is_tracked(m) for m in history)
