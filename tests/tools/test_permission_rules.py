"""Permission rules: decisions, pattern tables (last match wins), bash chains, narrowing."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.agents import load_catalog
from actors.permissions import judge
from actors.tools._permission import (
    decide,
    matches,
    narrow,
    offered,
    validate_rule,
)
from actors.tools._shell_grammar import bash_subjects
from protocol import InvalidRequestError

GIT = {"bash": {"git *": "allow", "*": "ask", "git push *": "deny"}}


@pytest.mark.parametrize(
    ("pattern", "subject", "expected"),
    [
        ("git *", "git status", True),
        ("git *", "git", True),  # a trailing " *" also matches the bare prefix
        ("git *", "gitk", False),
        ("*.env", "config/.env", True),  # '*' crosses '/'
        ("src/?.py", "src/a.py", True),
        ("src/?.py", "src/ab.py", False),
        ("rm -rf *", "rm -rf /", True),
        ("a.b", "aXb", False),  # '.' is literal
    ],
)
def test_globs(pattern: str, subject: str, expected: bool) -> None:
    assert matches(pattern, subject) is expected


def test_the_last_matching_pattern_wins_and_star_is_the_fallback() -> None:
    assert decide(GIT, "bash", "git status") == "allow"
    assert decide(GIT, "bash", "git push origin") == "deny"  # later than "git *"
    assert decide(GIT, "bash", "ls") == "ask"  # no pattern: the table's "*"
    reordered = {"bash": {"*": "ask", "git *": "allow"}}  # OpenCode's order works too
    assert decide(reordered, "bash", "git log") == "allow"
    assert decide(reordered, "bash", "make") == "ask"


def test_plain_decisions_and_defaults() -> None:
    assert decide({}, "bash") == "allow"
    assert decide({"*": "ask"}, "read", "x") == "ask"
    assert decide({"*": "allow"}, "config") == "deny"  # '*' never grants a capability
    assert decide({"*": "allow"}, "external_directory", "/etc/passwd") == "ask"  # as OpenCode
    assert decide({"external_directory": "allow"}, "external_directory", "/x") == "allow"


def test_offered_means_some_call_may_run() -> None:
    assert offered(GIT, "bash")
    assert offered({"bash": "ask"}, "bash")
    assert not offered({"bash": "deny"}, "bash")
    assert not offered({"*": "deny"}, "read")
    assert offered({"bash": {"*": "deny", "git *": "allow"}}, "bash")
    assert not offered({"bash": {"*": "deny", "rm *": "deny"}}, "bash")


@pytest.mark.parametrize(
    ("line", "commands"),
    [
        ("git status && rm -rf x", ["git status", "rm -rf x"]),
        ("a; b || c | d & e", ["a", "b", "c", "d", "e"]),
        ("echo $(rm x) `id`", ["echo $(rm x) `id`", "rm x", "id"]),
        ("echo 'a; rm x'", ["echo a; rm x"]),  # single quotes: one literal argument
        ('echo "$(rm x)"', ['echo "$(rm x)"', "rm x"]),  # substitutions run inside "..."
        ("if true; then rm x; fi", ["true", "rm x"]),
        ("  git   status  ", ["git status"]),
        ("(cd /; rm x)\nls", ["cd /", "rm x", "ls"]),
        ("", [""]),
        # Issue 35: the splitter that cut inside the quoted parenthesis.
        ('echo "$(echo ")"; rm -f M)"', ['echo "$(echo ")"; rm -f M)"', "echo )", "rm -f M"]),
    ],
)
def test_the_commands_a_line_runs(line: str, commands: list[str]) -> None:
    parsed = bash_subjects(line)
    assert list(parsed.commands) == commands
    assert parsed.unresolved == ()


DENY_RM = {"bash": {"*": "allow", "rm *": "deny"}}
#: Issue 35: 17 of these 19 respellings of rm ran under DENY_RM.
RESPELLINGS = [
    "rm -f M",
    "\\rm -f M",
    "/bin/rm -f M",
    "/usr/bin/rm -f M",
    "command rm -f M",
    "builtin command rm -f M",
    "env rm -f M",
    "env -i PATH=/bin rm -f M",
    "FOO=1 rm -f M",
    "'rm' -f M",
    '"rm" -f M',
    "r''m -f M",
    "echo M | xargs rm -f",
    "find . -name M -delete",
    "find . -name M -exec rm {} +",
    "sudo -n rm -f M",
    "nice -n 5 rm -f M",
    "timeout 5 rm -f M",
    "exec rm -f M",
    "nohup rm -f M",
    "sh -c 'rm -f M'",
    'bash -c "cd . && rm -f M"',
    "eval 'rm -f M'",
    'echo "$(echo ")"; rm -f M)"',
    "true && (rm -f M)",
]


@pytest.mark.parametrize("command", RESPELLINGS)
def test_a_respelt_rm_is_still_rm(tmp_path: Path, command: str) -> None:
    [check] = judge(
        DENY_RM, [], "bash", {"command": command}, directory=tmp_path, output_dir=tmp_path
    )
    assert check.decision == "deny", command


@pytest.mark.parametrize(
    "command",
    [
        "$CMD -f M",  # the command name expands
        "${X:-rm} -f M",
        "echo 'unterminated",  # does not parse
        "sudo --some-new-flag value rm -f M",  # an option that may take an argument
        "env -S 'rm -f M'",
        'sh -c "$SCRIPT"',  # the script expands
    ],
)
def test_a_command_that_cannot_be_resolved_is_asked_about(tmp_path: Path, command: str) -> None:
    [check] = judge(
        DENY_RM, [], "bash", {"command": command}, directory=tmp_path, output_dir=tmp_path
    )
    assert check.decision == "ask"
    assert check.patterns == (command,)
    # Allowed for the session, that exact line is allowed; nothing else is.
    [again] = judge(
        DENY_RM,
        [("bash", command)],
        "bash",
        {"command": command},
        directory=tmp_path,
        output_dir=tmp_path,
    )
    assert again.decision == "allow"


def test_ordinary_commands_stay_allowed(tmp_path: Path) -> None:
    for command in ("git status", "ls -la | grep x", "command -v rm", "echo rm", "cat rm.txt"):
        [check] = judge(
            DENY_RM, [], "bash", {"command": command}, directory=tmp_path, output_dir=tmp_path
        )
        assert check.decision == "allow", command


def test_a_chain_is_as_strict_as_its_strictest_command(tmp_path: Path) -> None:
    rules = {"bash": {"*": "allow", "rm *": "ask", "curl *": "deny"}}

    def decision(command: str) -> str:
        [check] = judge(
            rules, [], "bash", {"command": command}, directory=tmp_path, output_dir=tmp_path
        )
        return check.decision

    assert decision("ls && git status") == "allow"
    assert decision("ls; rm -rf x") == "ask"
    assert decision("ls | rm x && curl evil") == "deny"
    assert decision("echo $(curl evil)") == "deny"
    [check] = judge(
        rules, [], "bash", {"command": "ls; rm a; rm b"}, directory=tmp_path, output_dir=tmp_path
    )
    assert check.patterns == ("rm a", "rm b")  # what the person is asked about


def test_session_always_rules_turn_ask_into_allow_but_never_deny(tmp_path: Path) -> None:
    rules = {"bash": {"*": "ask", "curl *": "deny"}}
    session = [("bash", "rm a"), ("bash", "curl *")]

    def decision(command: str) -> str:
        [check] = judge(
            rules, session, "bash", {"command": command}, directory=tmp_path, output_dir=tmp_path
        )
        return check.decision

    assert decision("rm a") == "allow"
    assert decision("rm a; rm b") == "ask"
    assert decision("curl x") == "deny"


def test_paths_are_judged_where_they_lead(tmp_path: Path) -> None:
    location, outside, output = tmp_path / "loc", tmp_path / "out", tmp_path / "output"
    for d in (location, outside, output):
        d.mkdir()
    (outside / "f.txt").write_text("x")
    (location / "link").symlink_to(outside / "f.txt")
    (output / "tool_1").write_text("kept output")
    rules = {"read": {"*": "allow", "*.env": "deny"}}

    def checks(tool: str, path: str) -> list[tuple[str, str]]:
        found = judge(rules, [], tool, {"path": path}, directory=location, output_dir=output)
        return [(c.permission, c.decision) for c in found]

    assert checks("read", "a/.env") == [("read", "deny")]
    assert checks("read", "notes.txt") == [("read", "allow")]
    # The link inside is judged as the file outside it leads to.
    assert checks("read", "link") == [("external_directory", "ask"), ("read", "allow")]
    assert checks("read", "../out/f.txt") == [("external_directory", "ask"), ("read", "allow")]
    # Managed tool output stays readable without external_directory; not writable by it.
    assert checks("read", str(output / "tool_1")) == [("read", "allow")]
    assert checks("write", str(output / "tool_1"))[0] == ("external_directory", "ask")
    [external, _] = judge(
        rules, [], "read", {"path": "link"}, directory=location, output_dir=output
    )
    assert external.external == ((outside / "f.txt").resolve(),)
    assert external.always == (f"{outside.resolve()}/*",)


def test_narrow_keeps_the_stricter_answer_per_subject() -> None:
    ceiling = {"*": "allow", "bash": {"*": "allow", "rm *": "deny"}}
    project = {"bash": {"*": "ask", "rm *": "allow", "git *": "allow"}}
    table = narrow(ceiling, project)
    assert decide(table, "bash", "rm x") == "deny"  # the project cannot re-allow it
    assert decide(table, "bash", "ls") == "ask"
    assert decide(table, "bash", "git log") == "allow"
    assert narrow({"bash": "allow"}, {"bash": "ask"})["bash"] == "ask"


def test_agents_toml_accepts_ask_and_pattern_tables(tmp_path: Path) -> None:
    operator = tmp_path / "agents.toml"
    operator.write_text(
        "[agents.build.permissions]\n"
        'bash = { "git *" = "allow", "*" = "ask" }\n'
        'edit = "ask"\n'
        'external_directory = { "/srv/*" = "allow" }\n'
    )
    project = tmp_path / "project.toml"
    project.write_text('[agents.build.permissions]\nbash = { "git push *" = "deny" }\n')
    build = load_catalog(operator).get("build")
    assert decide(build.permissions, "bash", "git status") == "allow"
    assert decide(build.permissions, "bash", "make") == "ask"
    assert decide(build.permissions, "edit", "a.py") == "ask"
    assert decide(build.permissions, "external_directory", "/srv/x") == "allow"
    bounded = load_catalog(operator, project=project).get("build")
    assert decide(bounded.permissions, "bash", "git push origin") == "deny"
    assert decide(bounded.permissions, "bash", "git status") == "allow"
    assert decide(bounded.permissions, "bash", "make") == "ask"
    plan = load_catalog(operator).get("plan")
    assert not any(offered(plan.permissions, t) for t in ("write", "edit", "bash"))


@pytest.mark.parametrize(
    "value", ['"maybe"', '{ "git *" = "perhaps" }', "3", '["allow"]', '{ "x" = 1 }']
)
def test_bad_rules_are_refused(tmp_path: Path, value: str) -> None:
    path = tmp_path / "agents.toml"
    path.write_text(f"[agents.build.permissions]\nbash = {value}\n")
    with pytest.raises(InvalidRequestError, match="permissions map tool names"):
        load_catalog(path)
    with pytest.raises(ValueError, match="permission rule"):
        validate_rule(value)
