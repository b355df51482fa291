"""The scripted model's ``#hosted`` and ``#hosted-result`` directives."""

from __future__ import annotations

import pytest

from actors.llm import (
    HostedResult,
    ModelRequest,
    ScriptedProvider,
    ScriptError,
    ToolCall,
    parse_script,
)
from actors.llm._registry import SCRIPTED_MODEL


async def parts(script: str) -> list[object]:
    request = ModelRequest(
        session_id="ses_1", agent="build", model=SCRIPTED_MODEL, metadata={"script": script}
    )
    return [p async for p in ScriptedProvider().stream(request)]


async def test_hosted_call_and_result_stream_in_order() -> None:
    out = await parts('#hosted web_search {"query": "q"}\n#hosted-result {"content": "r"}')
    call = next(p for p in out if isinstance(p, ToolCall))
    result = next(p for p in out if isinstance(p, HostedResult))
    assert call.hosted
    assert call.input == {"query": "q"}
    assert result == HostedResult(id=call.id, content={"content": "r"}, error=False)
    assert out.index(call) < out.index(result)
    # Hosted calls alone are no reason to finish for tool calls.
    assert out[-1].reason == "stop"  # type: ignore[attr-defined]


async def test_error_flag() -> None:
    out = await parts("#hosted web_search\n#hosted-result error")
    (result,) = [p for p in out if isinstance(p, HostedResult)]
    assert result.error
    assert result.content == {}


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ("#hosted-result {}", "needs a #hosted call"),
        ("#hosted web_search\n#hosted-result [1]", "must be a JSON object"),
        ("#hosted web_search\n#hosted-result {oops", "not JSON"),
        ("#hosted", "needs a name"),
    ],
)
def test_bad_hosted_directives_are_script_errors(script: str, message: str) -> None:
    with pytest.raises(ScriptError, match=message):
        parse_script(script)
