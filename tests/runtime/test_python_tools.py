"""Python functions as tools (``actors.tools.tool``): schemas, and calls through a real runtime.

The runtime is real (temp-file SQLite, tool threads, the scripted model
calling the tool by directive); an async tool runs on the runtime's loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypedDict

import attrs
import jsonschema
import pytest
from feed import Feed

from actors.runtime import Runtime, RuntimeConfig
from actors.tools import CallContext, ToolError, ToolSchemaError, tool
from protocol.requests import PromptInput
from server.embedded import Embedded

GUARD = 10.0


@attrs.frozen
class Address:
    street: str
    number: int = 1


class Point(TypedDict):
    x: float
    y: float


class Partial(TypedDict, total=False):
    label: str


def schema_of(fn: Any) -> dict[str, Any]:
    made = tool(fn)
    jsonschema.Draft202012Validator.check_schema(dict(made.input_schema))
    return dict(made.input_schema)


def test_primitives_and_defaults_make_an_object_schema() -> None:
    def f(
        ctx: CallContext, s: str, i: int, x: float, b: bool, n: None, a: Any, opt: int = 3
    ) -> str:
        """Doc."""
        return ""

    assert schema_of(f) == {
        "type": "object",
        "properties": {
            "s": {"type": "string"},
            "i": {"type": "integer"},
            "x": {"type": "number"},
            "b": {"type": "boolean"},
            "n": {"type": "null"},
            "a": {},
            "opt": {"type": "integer", "default": 3},
        },
        "required": ["s", "i", "x", "b", "n", "a"],
        "additionalProperties": False,
    }


def test_containers_literals_unions_and_annotated() -> None:
    def f(
        names: list[str],
        pair: tuple[int, str],
        many: tuple[int, ...],
        seq: Sequence[float],
        tags: set[str],
        scores: dict[str, int],
        meta: Mapping[str, Any],
        mode: Literal["fast", "slow"],
        maybe: int | None,
        note: Annotated[str, "what to say"],
    ) -> None:
        """Doc."""

    props = schema_of(f)["properties"]
    assert props["names"] == {"type": "array", "items": {"type": "string"}}
    assert props["pair"] == {
        "type": "array",
        "prefixItems": [{"type": "integer"}, {"type": "string"}],
        "minItems": 2,
        "maxItems": 2,
    }
    assert props["many"] == {"type": "array", "items": {"type": "integer"}}
    assert props["seq"] == {"type": "array", "items": {"type": "number"}}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
    assert props["scores"] == {"type": "object", "additionalProperties": {"type": "integer"}}
    assert props["meta"] == {"type": "object", "additionalProperties": {}}
    assert props["mode"] == {"enum": ["fast", "slow"]}
    assert props["maybe"] == {"anyOf": [{"type": "integer"}, {"type": "null"}]}
    assert props["note"] == {"type": "string", "description": "what to say"}


def test_attrs_classes_and_typeddicts_are_objects() -> None:
    def f(home: Address, at: Point, extra: Partial, route: list[Point]) -> None:
        """Doc."""

    props = schema_of(f)["properties"]
    assert props["home"] == {
        "type": "object",
        "properties": {"street": {"type": "string"}, "number": {"type": "integer"}},
        "required": ["street"],
        "additionalProperties": False,
    }
    point = {
        "type": "object",
        "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
        "required": ["x", "y"],
        "additionalProperties": False,
    }
    assert props["at"] == point
    assert props["extra"] == {
        "type": "object",
        "properties": {"label": {"type": "string"}},
        "additionalProperties": False,
    }
    assert props["route"] == {"type": "array", "items": point}


def test_name_and_description_come_from_the_function() -> None:
    @tool
    def weather(city: str) -> str:
        """Today's weather in a city.

        Uses the public forecast.
        """
        return city

    assert weather.name == "weather"
    assert weather.description == "Today's weather in a city.\n\nUses the public forecast."
    assert weather("Oslo") == "Oslo"  # still callable as a function

    @tool(name="forecast", description="Tomorrow's.")
    def other(city: str) -> str:
        return city

    assert (other.name, other.description) == ("forecast", "Tomorrow's.")


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def f(x):\n    'Doc.'", "parameter 'x' has no annotation"),
        ("def f(x: bytes):\n    'Doc.'", "parameter 'x': unsupported annotation"),
        ("def f(*xs: int):\n    'Doc.'", r"\*xs cannot be filled in"),
        ("def f(x: dict[int, str]):\n    'Doc.'", "keys are strings"),
        ("def f(x: int): pass", "needs a docstring"),
        ("def f(x: list[complex]):\n    'Doc.'", "unsupported annotation"),
    ],
)
def test_a_bad_signature_fails_when_decorated_with_a_clear_error(source: str, message: str) -> None:
    namespace: dict[str, Any] = {}
    exec(source, namespace)
    with pytest.raises(ToolSchemaError, match=message) as caught:
        tool(namespace["f"])
    assert "tool 'f'" in str(caught.value)


async def test_a_name_taken_twice_fails_the_start(tmp_path: Path) -> None:
    @tool
    def read(path: str) -> str:
        """Shadows the built-in."""
        return path

    with pytest.raises(ValueError, match="tools: a tool named 'read' is already registered"):
        Runtime(RuntimeConfig(data_dir=tmp_path / "data", tools=(read,)))


# --- through a real runtime -------------------------------------------------------


def call(name: str, payload: str) -> str:
    return f"#tool {name} {payload}\n#step\n#text Done."


async def run_prompt(oc: Embedded, text: str) -> tuple[str, Feed]:
    feed = Feed()
    oc.runtime.bus.subscribe(feed)
    session = await oc.sessions.create()
    await oc.sessions.prompt(session.id, PromptInput(text=text))
    await oc.sessions.wait(session.id)
    return session.id, feed


def terminal(feed: Feed, sid: str) -> dict[str, Any]:
    (found,) = [
        m
        for m in feed.events
        if m.get("durable")
        and m["data"].get("sessionID") == sid
        and m["type"] in ("session.tool.success", "session.tool.failed")
    ]
    return {"type": found["type"], **found["data"]}


async def test_a_sync_tool_gets_converted_input_and_its_context(
    tmp_path: Path, workdir: Path
) -> None:
    seen: dict[str, Any] = {}

    @tool
    def deliver(ctx: CallContext, to: Address, at: Point, mode: Literal["a", "b"] = "a") -> dict:
        """Deliver a parcel."""
        seen.update(to=to, at=at, mode=mode, session=ctx.session_id, location=ctx.location)
        ctx.progress(stage="packed")
        return {"street": to.street, "number": to.number, "x": at["x"]}

    config = RuntimeConfig(data_dir=tmp_path / "data", default_directory=str(workdir))
    async with Embedded(config=config, tools=[deliver]) as oc:
        payload = '{"to": {"street": "Main"}, "at": {"x": 1, "y": 2.5}}'
        sid, feed = await run_prompt(oc, call("deliver", payload))
    assert seen["to"] == Address(street="Main", number=1)
    assert seen["at"] == {"x": 1.0, "y": 2.5}
    assert seen["mode"] == "a"
    assert seen["session"] == sid
    assert seen["location"] == workdir
    done = terminal(feed, sid)
    assert done["type"] == "session.tool.success"
    assert done["metadata"]["structured"] == {"street": "Main", "number": 1, "x": 1.0}
    assert '"street": "Main"' in done["content"][0]["text"]
    progress = [m for m in feed.events if m["type"] == "session.tool.progress"]
    assert [p["data"]["metadata"] for p in progress] == [{"stage": "packed"}]


async def test_a_raising_tool_fails_its_call_and_the_session_goes_on(
    tmp_path: Path, workdir: Path
) -> None:
    @tool
    def explode(reason: str) -> str:
        """Always fails."""
        raise ValueError(f"boom: {reason}")

    @tool
    def refuse(reason: str) -> str:
        """Fails with a tag of its own."""
        raise ToolError(f"no: {reason}", type="shop.closed")

    @tool
    async def explode_later(reason: str) -> str:
        """Fails on the loop."""
        raise KeyError(reason)

    config = RuntimeConfig(data_dir=tmp_path / "data", default_directory=str(workdir))
    async with Embedded(config=config, tools=[explode, refuse, explode_later]) as oc:
        sid, feed = await run_prompt(oc, call("explode_later", '{"reason": "z"}'))
        assert terminal(feed, sid)["error"] == {"type": "tool.error", "message": "KeyError: 'z'"}

        sid, feed = await run_prompt(oc, call("explode", '{"reason": "x"}'))
        failed = terminal(feed, sid)
        assert failed["type"] == "session.tool.failed"
        assert failed["error"] == {"type": "tool.error", "message": "ValueError: boom: x"}
        assert "session.execution.succeeded" in feed.types(sid)

        sid, feed = await run_prompt(oc, call("refuse", '{"reason": "y"}'))
        assert terminal(feed, sid)["error"] == {"type": "shop.closed", "message": "no: y"}

        # Input the schema refuses never reaches the function.
        sid, feed = await run_prompt(oc, call("refuse", '{"reason": 3}'))
        assert terminal(feed, sid)["error"]["type"] == "invalid-input"


async def test_an_interrupted_async_tool_is_cancelled_on_the_loop(
    tmp_path: Path, workdir: Path
) -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()
    loops: list[asyncio.AbstractEventLoop] = []

    @tool
    async def wait_forever(ctx: CallContext, what: str) -> str:
        """Waits until interrupted."""
        loops.append(asyncio.get_running_loop())
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            assert ctx.cancelled
            cancelled.set()
            raise
        return what

    config = RuntimeConfig(data_dir=tmp_path / "data", default_directory=str(workdir))
    async with Embedded(config=config, tools=[wait_forever]) as oc:
        feed = Feed()
        oc.runtime.bus.subscribe(feed)
        session = await oc.sessions.create()
        await oc.sessions.prompt(
            session.id, PromptInput(text=call("wait_forever", '{"what": "x"}'))
        )
        async with asyncio.timeout(GUARD):
            await started.wait()
        assert loops == [asyncio.get_running_loop()]
        assert await oc.runtime.interrupt(session.id)
        await feed.wait("session.execution.interrupted", sessionID=session.id)
        assert cancelled.is_set()
        failed = terminal(feed, session.id)
        assert failed["type"] == "session.tool.failed"
        assert failed["error"]["type"] == "aborted"
        assert await oc.runtime.store.queries.open_tool_calls(session.id) == []


async def test_permissions_apply_to_python_tools(tmp_path: Path, workdir: Path) -> None:
    ran: list[str] = []

    @tool
    def secret(what: str) -> str:
        """Not for plan."""
        ran.append(what)
        return what

    data = tmp_path / "data"
    data.mkdir()
    (data / "agents.toml").write_text('[agents.build.permissions]\nsecret = "deny"\n')
    config = RuntimeConfig(data_dir=data, default_directory=str(workdir))
    async with Embedded(config=config, tools=[secret]) as oc:
        sid, feed = await run_prompt(oc, call("secret", '{"what": "x"}'))
    assert terminal(feed, sid)["error"]["type"] == "permission.denied"
    assert ran == []


async def test_a_large_result_is_bounded_like_a_built_in_tools(
    tmp_path: Path, workdir: Path
) -> None:
    @tool
    async def dump(lines: int) -> str:
        """Many lines."""
        return "\n".join(f"line {i}" for i in range(lines))

    config = RuntimeConfig(
        data_dir=tmp_path / "data", default_directory=str(workdir), tool_output_max_lines=100
    )
    async with Embedded(config=config, tools=[dump]) as oc:
        sid, feed = await run_prompt(oc, call("dump", '{"lines": 5000}'))
    done = terminal(feed, sid)
    assert done["type"] == "session.tool.success"
    assert done["metadata"]["truncated"] is True
    shown = "\n".join(item["text"] for item in done["content"])
    # The beginning and the end kept, the middle in the managed file.
    assert "line 49\n" in shown
    assert shown.endswith("line 4999")
    assert "line 2500" not in shown
    saved = Path(done["metadata"]["outputPath"])
    assert (await asyncio.to_thread(saved.read_text)).endswith("line 4999")
