"""Parsing the script language into steps (the syntax is in actors.llm.scripted)."""

from __future__ import annotations

import pytest

from actors.llm import ScriptError, parse_script
from actors.llm._script import Failure, Script, Step, TextBlock, ToolBlock, find_script


def test_a_full_script_parses_into_steps() -> None:
    script = parse_script(
        "# a comment\n"
        "#\n"
        "#reasoning plan\n"
        "#delay 5\n"
        "#chunk 2\n"
        "#text hello\n"
        '#tool read {"path": "a"}\n'
        "#fail internal retry-after=7 attempts=2 should-retry=false after-output\n"
        "#usage input=1 output=2 reasoning=3 cache-read=4 cache-write=5 cost=1.5\n"
        "#finish length\n"
        "#step\n"
        "#fail transport delivery=sent once\n"
    )

    assert script == Script(
        steps=(
            Step(
                blocks=(
                    TextBlock(kind="reasoning", text="plan"),
                    TextBlock(kind="text", text="hello", delay_ms=5, chunk=2),
                    ToolBlock(name="read", input={"path": "a"}, delay_ms=5, chunk=2),
                ),
                finish="length",
                usage={
                    "input": 1,
                    "output": 2,
                    "reasoning": 3,
                    "cache_read": 4,
                    "cache_write": 5,
                    "cost": 1.5,
                },
                failure=Failure(
                    kind="internal",
                    attempts=2,
                    after_output=True,
                    retry_after_ms=7,
                    should_retry=False,
                ),
            ),
            Step(failure=Failure(kind="transport", attempts=1, delivery="sent")),
        )
    )


def test_separators_at_either_end_are_dropped() -> None:
    assert parse_script("---\n#step\n#text a\n---\n") == Script(
        steps=(Step(blocks=(TextBlock(kind="text", text="a"),)),)
    )


def test_pace_resets_at_each_step() -> None:
    script = parse_script("#delay 9\n#chunk 1\n#text a\n---\n#text b")

    assert script.steps[1].blocks == (TextBlock(kind="text", text="b"),)


def test_a_failure_applies_to_the_attempts_it_names() -> None:
    assert [Failure(kind="auth").applies(a) for a in (1, 2, 50)] == [True, True, True]
    assert [Failure(kind="auth", attempts=2).applies(a) for a in (1, 2, 3)] == [True, True, False]


def test_find_script_is_none_for_prose_without_directives() -> None:
    assert find_script("just a question\n--- \n#hashtag\n# heading") is None
    assert find_script("prose\n#finish stop") == Script(steps=(Step(finish="stop"),))


def test_a_script_error_names_its_line() -> None:
    with pytest.raises(ScriptError, match=r"^line 3: #chunk expects") as caught:
        parse_script("#text a\n\n#chunk x")
    assert caught.value.line == 3
    assert isinstance(caught.value, ValueError)
