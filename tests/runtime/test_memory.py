"""The decode caches are bounded by the bytes they hold, not by their number of entries."""

from __future__ import annotations

import asyncio
import collections
import gc
import tracemalloc
from pathlib import Path

import attrs

from actors.llm import ChatMessage, TextContent
from actors.runtime import Runtime, RuntimeConfig
from actors.session.history import ChatCache, to_chat
from protocol.lru import ENTRY_OVERHEAD, PREFIX_TRIES, ByteLRU, reused_prefix
from protocol.requests import PromptInput
from protocol.shapes import AssistantMessage, MessageTime, TextPart, UserMessage
from storage.queries import HistoryCache

BOUND = 3 * 1024 * 1024
PROMPT = 1_000_000


async def test_large_prompts_keep_both_caches_within_their_byte_bound(
    tmp_path: Path, workdir: Path
) -> None:
    config = RuntimeConfig(
        data_dir=tmp_path / "data", default_directory=str(workdir), decode_cache_bytes=BOUND
    )
    async with Runtime(config) as rt:
        session = await rt.sessions.create()
        for i in range(8):
            text = f"{i:04d}" + "x" * PROMPT
            await rt.sessions.prompt(session.id, PromptInput(text=text))
            await rt.execution.wait_idle(session.id)
            queries = rt.store.queries.cache
            chat = rt.services.drain.chat_cache
            assert queries.bytes <= queries.max_bytes == BOUND
            assert chat.bytes <= chat.max_bytes == BOUND
            histories = rt.store.queries.histories
            assert histories.bytes <= histories.max_bytes
        # Eight megabytes went through caches of three: most of it was let go,
        # and the transcript still reads back whole.
        assert rt.store.queries.cache.bytes > 0
        context = await rt.sessions.context(session.id)
        texts = [m.text for m in context if isinstance(m, UserMessage)]
        assert [t[:4] for t in texts] == [f"{i:04d}" for i in range(8)]


def test_the_lru_evicts_the_least_recently_used_first_and_never_keeps_an_oversized_value() -> None:
    lru: ByteLRU[str, str] = ByteLRU(3 * (100 + ENTRY_OVERHEAD))
    for key in "abc":
        lru.put(key, key, 100)
    assert lru.get("a") == "a"  # now the most recent
    lru.put("d", "d", 100)
    assert lru.get("b") is None
    assert {k: lru.get(k) for k in "acd"} == {"a": "a", "c": "c", "d": "d"}
    lru.put("huge", "h", 10_000)
    assert lru.get("huge") is None
    assert lru.bytes <= lru.max_bytes


def test_the_chat_cache_weighs_the_text_it_keeps_alive() -> None:
    cache = ChatCache(2 * 1024 * 1024)
    time = MessageTime(created=0, updated=0)
    for i in range(10):
        message = UserMessage(
            id=f"msg_{i}", session_id="ses_x", seq=i, time=time, text="y" * PROMPT
        )
        assert cache.get(message)[0].parts[0].text == message.text  # type: ignore[union-attr]
        assert cache.bytes <= cache.max_bytes


def test_a_history_converted_through_the_cache_equals_one_converted_afresh() -> None:
    """The per-session reuse of the last conversion never serves a stale prefix:
    appended, changed, removed and re-windowed histories convert as without a cache."""
    cache = ChatCache()
    time = MessageTime(created=0, updated=0)

    def user(i: int) -> UserMessage:
        return UserMessage(id=f"msg_u{i}", session_id="ses_x", seq=2 * i, time=time, text=f"u{i}")

    def assistant(i: int, text: str) -> AssistantMessage:
        return AssistantMessage(
            id=f"msg_a{i}",
            session_id="ses_x",
            seq=2 * i + 1,
            time=time,
            parts=(TextPart(ordinal=0, text=text),),
        )

    history: list[UserMessage | AssistantMessage] = []
    steps = []
    for i in range(30):
        history = [*history, user(i), assistant(i, f"a{i}")]
        steps.append(list(history))
    # The newest answer changes (a later attempt), a middle one is edited, the
    # tail is removed (a revert), the window starts later (a compaction).
    steps.append([*history[:-1], assistant(29, "rewritten")])
    steps.append([*history[:10], attrs.evolve(history[10], text="edited"), *history[11:]])
    steps.append(history[:20])
    steps.append(history[40:])
    steps.append(history)
    for h in steps:
        assert to_chat(h, cache) == to_chat(h)
        assert to_chat(h, cache, native=False) == to_chat(h, native=False)


def test_reused_prefix_stops_at_the_first_difference_near_the_end() -> None:
    last = tuple(range(20))
    assert reused_prefix(last, last) == 20
    assert reused_prefix((*last, 20, 21), last) == 20  # grown: all of last
    assert reused_prefix((*last[:19], 99), last) == 19  # the newest one changed
    assert reused_prefix((*last[:15], 99, *last[16:]), last) == 15
    # A difference further back than PREFIX_TRIES from the end: start over.
    early = 20 - PREFIX_TRIES - 1
    assert reused_prefix((*last[:early], 99, *last[early + 1 :]), last) == 0
    assert reused_prefix(last[:5], last) == 5  # shrunk: what is left
    assert reused_prefix((), last) == 0


async def test_turns_leave_no_reference_cycles_behind(tmp_path: Path) -> None:
    """Everything a turn makes (its session actor, its attempt, its tool calls
    and their owner) is freed by reference counting when the turn is done. A
    cycle would wait for the collector, whose passes grow with what survives
    to them: with 100 sessions stepping that was 38 objects a step, an eighth
    of the loop's time in collections and their pauses in its lag."""
    config = RuntimeConfig(data_dir=tmp_path / "data", default_directory=str(tmp_path))
    script = '#tool write {"path": "n.txt", "content": "x"}\n#step\n#text done'
    async with Runtime(config) as rt:
        sid = (await rt.sessions.create()).id

        async def turn(text: str) -> None:
            await rt.sessions.prompt(sid, PromptInput(text=text, resume=False))
            assert (await rt.execution.resume(sid)).kind == "succeeded"

        await turn(script)  # first turns fill the caches that live on
        await turn("plain")
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for _ in range(3):
                await turn(script)
                await turn("plain")
            await rt.execution.wait_idle(sid)
            for _ in range(10):  # the idle actor's retirement, through two mailboxes
                await asyncio.sleep(0)
            assert gc.collect() == 0, sorted({type(o).__qualname__ for o in gc.garbage})
        finally:
            gc.garbage.clear()
            gc.set_debug(0)
            gc.enable()


def test_the_lru_keeps_an_oversized_value_alone_when_asked_to() -> None:
    lru: ByteLRU[str, str] = ByteLRU(3 * (100 + ENTRY_OVERHEAD), oversized="alone")
    for key in "abc":
        lru.put(key, key, 100)
    lru.put("huge", "h", 10_000)
    assert [k for k in "abc" if k in lru] == []
    assert lru.get("huge") == "h"
    assert lru.bytes == 10_000 + ENTRY_OVERHEAD
    lru.put("d", "d", 100)  # the next value pushes it out: the bound holds again
    assert "huge" not in lru
    assert lru.get("d") == "d"
    assert lru.bytes <= lru.max_bytes


async def test_a_history_heavier_than_its_cache_is_kept_and_then_read_only_where_it_changed(
    tmp_path: Path, workdir: Path
) -> None:
    """Dropping it made every step a full read: the whole transcript fetched and
    decoded again, its stored text and its decoded copy held at once."""
    config = RuntimeConfig(data_dir=tmp_path / "data", default_directory=str(workdir))
    async with Runtime(config) as rt:
        queries = rt.store.queries
        queries.histories = HistoryCache(2 * PROMPT)
        session = await rt.sessions.create()
        kept: list[object] = []
        for i in range(4):
            text = f"{i:04d}" + "x" * PROMPT
            await rt.sessions.prompt(session.id, PromptInput(text=text))
            await rt.execution.wait_idle(session.id)
            kept.append(queries.histories.get(session.id))
        assert all(h is not None for h in kept)
        assert queries.histories.bytes > queries.histories.max_bytes  # kept alone
        # Later reads built on the kept rows: the first prompt's message is the same object.
        first = [h.order[0] for h in kept]  # type: ignore[attr-defined]
        assert all(m is first[0] for m in first)
        assert await rt.sessions.context(session.id) == await queries.full_context(session.id)


async def test_a_prompts_text_is_held_once_after_its_step(tmp_path: Path, workdir: Path) -> None:
    """Decoded, projected, cached, converted for the model: after the steps, each
    prompt's megabyte is one block in memory (the caches share the decoded text)."""
    config = RuntimeConfig(data_dir=tmp_path / "data", default_directory=str(workdir))
    async with Runtime(config) as rt:
        session = await rt.sessions.create()
        await rt.sessions.prompt(session.id, PromptInput(text="warm-up"))
        await rt.execution.wait_idle(session.id)
        tracemalloc.start()
        try:
            for i in range(4):
                await rt.sessions.prompt(session.id, PromptInput(text=f"{i:04d}" + "x" * PROMPT))
                await rt.execution.wait_idle(session.id)
            gc.collect()
            large = [t for t in tracemalloc.take_snapshot().traces if t.size >= PROMPT // 2]
        finally:
            tracemalloc.stop()
        assert len(large) == 4, [str(t.traceback) for t in large]


async def test_cached_transcript_messages_are_left_out_of_the_collectors_passes(
    tmp_path: Path, workdir: Path
) -> None:
    """A full pass of the cyclic collector walks every object it tracks, with the
    loop stopped (issue #42 section 1). The caches' decoded messages and their
    conversions for the model were about 20 such objects a step, growing with
    the histories (42,000 after 100 sessions x 20 prompts: an 11 ms pass). They
    are immutable and leave the collector when cached (protocol.untrack), and so
    do the tuples and the caches' dicts holding them (a pass visited every entry
    of those): what a pass walks no longer grows with the transcripts."""
    config = RuntimeConfig(data_dir=tmp_path / "data", default_directory=str(workdir))
    kinds = (UserMessage, AssistantMessage, MessageTime, TextPart, ChatMessage, TextContent)
    async with Runtime(config) as rt:
        sid = (await rt.sessions.create()).id

        async def turn(i: int) -> None:
            await rt.sessions.prompt(sid, PromptInput(text=f"prompt {i}", resume=False))
            assert (await rt.execution.resume(sid)).kind == "succeeded"

        for i in range(20):
            await turn(i)
        gc.collect()

        def holds(value: object) -> bool:
            if isinstance(value, kinds):
                return True
            if type(value) is tuple:
                return any(holds(item) for item in value)
            if isinstance(value, dict):  # the caches' dicts (an OrderedDict too)
                return any(holds(item) for item in value.values())
            return type(value).__name__ in ("_History", "_Converted")  # the cached histories

        tracked = collections.Counter(type(o).__name__ for o in gc.get_objects() if holds(o))
        history = await rt.sessions.context(sid)
        assert history == await rt.store.queries.full_context(sid)  # and still served whole
    assert len(history) == 40
    assert tracked == {}
