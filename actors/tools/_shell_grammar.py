"""The commands a bash command line runs, read with a real shell grammar.

Permission rules for bash (``{"*": "allow", "rm *": "deny"}``) are matched
against *subjects*: one per command the line runs. A text match on the line
was fooled by every respelling (``\\rm``, ``/bin/rm``, ``'rm'``, ``r''m``,
``command rm``, ``env rm``, ``FOO=1 rm``, ``xargs rm``, ``sh -c "rm x"``…),
so the line is parsed with tree-sitter's bash grammar (``tree-sitter`` and
``tree-sitter-bash``: MIT, compiled, about 20 µs a line; bashlex, the other
candidate, is GPL-3.0 and could not ship with this MIT package) and each
command node becomes a subject:

- its words with quoting removed (``'rm'``, ``r''m``, ``\\rm`` are ``rm``),
  leading assignments dropped, the command name's directory dropped
  (``/bin/rm`` is ``rm``); an argument that expands (``$X``, ``$(…)``)
  stays as written;
- commands inside substitutions, pipelines, lists, groups, conditionals,
  loops and function bodies are subjects of their own;
- a wrapper adds the command it runs as a further subject: ``command``,
  ``builtin``, ``exec``, ``env``, ``nice``, ``nohup``, ``timeout``, ``sudo``,
  ``doas``, ``stdbuf``, ``setsid``, ``ionice``, ``time``, ``busybox``,
  ``xargs`` (``echo`` without one), ``find -exec``/``-execdir``/``-ok``, and
  the scripts of ``sh``/``bash``/``dash``/``zsh``/``ksh -c`` and ``eval``,
  parsed in turn; ``find -delete`` adds ``rm`` with find's paths.

What cannot be resolved is reported (:attr:`Subjects.unresolved`) and the
call is asked about whatever the rules say: a line that does not parse, a
command name that expands (``$X y``), a wrapper option this module does not
know (it might take an argument), a ``-c`` script that expands, wrappers
nested deeper than ``MAX_DEPTH``.

This bounds respellings, not what a program may do: ``python -c``, ``perl``,
a script in the project, ``git`` aliases or hooks run what they like. Only
an allow-list (``{"*": "deny", "git status": "allow"}``) bounds bash.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from typing import Final

import attrs
import tree_sitter
import tree_sitter_bash

__all__ = ["MAX_DEPTH", "Subjects", "bash_subjects"]

#: Wrappers and ``-c`` scripts resolved inside one another at most this deep.
MAX_DEPTH: Final = 8


@attrs.frozen(kw_only=True)
class Subjects:
    """The subjects of a command line, and why some of it could not be resolved."""

    commands: tuple[str, ...]
    unresolved: tuple[str, ...] = ()


@functools.cache
def _parser() -> tree_sitter.Parser:
    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_bash.language()))


def bash_subjects(command: str) -> Subjects:
    """Every command ``command`` runs, as subjects for permission rules."""
    out = _Collected()
    out.line(command, 0)
    commands = tuple(dict.fromkeys(c for c in out.commands if c))
    return Subjects(commands=commands or ("",), unresolved=tuple(out.unresolved))


class _Unresolved(Exception):
    """A part of the line whose command cannot be known statically."""


class _Word:
    """One word: its value with quoting removed, or None if it expands; its text."""

    __slots__ = ("text", "value")

    def __init__(self, value: str | None, text: str) -> None:
        self.value = value
        self.text = text

    @property
    def shown(self) -> str:
        return self.text if self.value is None else self.value


class _Collected:
    def __init__(self) -> None:
        self.commands: list[str] = []
        self.unresolved: list[str] = []

    def line(self, source: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            self.unresolved.append(f"wrappers nested deeper than {MAX_DEPTH}")
            return
        tree = _parser().parse(source.encode("utf-8", "surrogateescape"))
        root = tree.root_node
        if root.has_error:
            self.commands.append(" ".join(source.split()))
            self.unresolved.append("the command line does not parse")
            return
        stack = [root]
        while stack:
            node = stack.pop()
            if node.type == "command":
                self._command(node, depth)
            stack.extend(reversed(node.children))

    def _command(self, node: tree_sitter.Node, depth: int) -> None:
        name = node.child_by_field_name("name")
        if name is None:
            return  # only assignments and redirections: nothing runs
        words = [_word(name)] + [
            _word(c) for c in node.children_by_field_name("argument") if c.is_named
        ]
        self.argv(words, depth)

    def argv(self, words: Sequence[_Word], depth: int) -> None:
        """The subject of ``words`` run as a command, and of what it runs in turn."""
        if not words:
            return
        head = words[0]
        if head.value is None:
            self.commands.append(" ".join(w.shown for w in words))
            self.unresolved.append(f"the command name {head.text!r} is computed")
            return
        name = os.path.basename(head.value) or head.value
        self.commands.append(" ".join([name, *(w.shown for w in words[1:])]))
        inner = _WRAPPERS.get(name)
        if inner is None:
            return
        if depth >= MAX_DEPTH:
            self.unresolved.append(f"wrappers nested deeper than {MAX_DEPTH}")
            return
        try:
            inner(self, list(words[1:]), depth + 1)
        except _Unresolved as exc:
            self.unresolved.append(f"{name}: {exc}")


def _word(node: tree_sitter.Node) -> _Word:
    text = (node.text or b"").decode("utf-8", "surrogateescape")
    return _Word(_literal(node), text)


def _literal(node: tree_sitter.Node) -> str | None:
    """``node``'s value after quote removal; None if it expands (parameters, substitutions)."""
    kind = node.type
    text = (node.text or b"").decode("utf-8", "surrogateescape")
    if kind == "command_name":
        return _literal(node.children[0]) if node.child_count == 1 else None
    if kind in ("word", "number"):
        return _unescape(text)
    if kind == "raw_string":
        return text[1:-1]
    if kind == "ansi_c_string":
        return None if "\\" in text else text[2:-1]
    if kind == "string":
        parts = []
        for child in node.children:
            if child.type == '"':
                continue
            if child.type != "string_content":
                return None
            content = (child.text or b"").decode("utf-8", "surrogateescape")
            parts.append(_unescape(content, '$`"\\\n'))
        return "".join(parts)
    if kind == "concatenation":
        pieces = [_literal(c) for c in node.children]
        return None if any(p is None for p in pieces) else "".join(pieces)  # type: ignore[arg-type]
    return None


def _unescape(text: str, escapable: str | None = None) -> str:
    """``text`` with its backslashes removed as bash does: before any character
    (unquoted) or, inside double quotes, only before one of ``escapable``; a
    backslash-newline joins lines."""
    out, i = [], 0
    while i < len(text):
        if (
            text[i] == "\\"
            and i + 1 < len(text)
            and (escapable is None or text[i + 1] in escapable)
        ):
            if text[i + 1] != "\n":
                out.append(text[i + 1])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


# -- wrappers ----------------------------------------------------------------------------------

Wrapper = Callable[[_Collected, list[_Word], int], None]


def _options(
    words: list[_Word],
    *,
    flags: str = "",
    valued: str = "",
    long_flags: Sequence[str] = (),
    long_valued: Sequence[str] = (),
) -> list[_Word]:
    """``words`` after the wrapper's own options; an option it does not know is unresolved.

    ``flags``/``valued``: short options without/with an argument; long ones
    likewise (a valued long option may also be written ``--name=value``).
    """
    i = 0
    while i < len(words):
        value = words[i].value
        if value is None:
            raise _Unresolved(f"the option {words[i].text!r} is computed")
        if value == "--":
            return words[i + 1 :]
        if not value.startswith("-") or value == "-":
            return words[i:]
        if value.startswith("--"):
            key = value.split("=", 1)[0][2:]
            if key in long_flags or ("=" in value and key in long_valued):
                i += 1
            elif key in long_valued:
                i += 2
            else:
                raise _Unresolved(f"unknown option {value!r}")
            continue
        cluster = value[1:]
        for n, letter in enumerate(cluster):
            if letter in valued:
                i += 1 if n + 1 < len(cluster) else 2
                break
            if letter not in flags:
                raise _Unresolved(f"unknown option -{letter}")
        else:
            i += 1
    return []


def _run(out: _Collected, words: list[_Word], depth: int) -> None:
    out.argv(words, depth)


def _command(out: _Collected, words: list[_Word], depth: int) -> None:
    if any(w.value in ("-v", "-V") for w in words[:2]):
        return  # ``command -v rm`` names rm, runs nothing
    out.argv(_options(words, flags="p"), depth)


def _exec(out: _Collected, words: list[_Word], depth: int) -> None:
    out.argv(_options(words, flags="cl", valued="a"), depth)


def _env(out: _Collected, words: list[_Word], depth: int) -> None:
    for w in words:
        value = w.value or ""
        if not value.startswith("-") or value == "--":
            break
        if value.startswith(("-S", "--split-string")):
            raise _Unresolved("-S splits a string into a command")
    rest = _options(
        words,
        flags="i0v",
        valued="uC",
        long_flags=("ignore-environment", "null", "debug"),
        long_valued=("unset", "chdir"),
    )
    while rest and rest[0].value is not None and "=" in rest[0].value:
        rest = rest[1:]
    out.argv(rest, depth)


def _nice(out: _Collected, words: list[_Word], depth: int) -> None:
    if words and words[0].value and words[0].value[1:].isdigit() and words[0].value[0] == "-":
        words = words[1:]  # nice -10 cmd
    out.argv(_options(words, valued="n", long_valued=("adjustment",)), depth)


def _timeout(out: _Collected, words: list[_Word], depth: int) -> None:
    rest = _options(
        words,
        flags="v",
        valued="ks",
        long_flags=("preserve-status", "foreground", "verbose"),
        long_valued=("kill-after", "signal"),
    )
    out.argv(rest[1:], depth)  # after the duration


def _sudo(out: _Collected, words: list[_Word], depth: int) -> None:
    rest = _options(
        words,
        flags="AbEeHiKklnPSsVv",
        valued="CDghprtUuT",
        long_flags=(
            "askpass",
            "background",
            "preserve-env",
            "edit",
            "set-home",
            "login",
            "non-interactive",
            "preserve-groups",
            "stdin",
            "shell",
            "reset-timestamp",
        ),
        long_valued=(
            "close-from",
            "chdir",
            "group",
            "host",
            "prompt",
            "role",
            "type",
            "other-user",
            "user",
            "command-timeout",
        ),
    )
    out.argv(rest, depth)


def _doas(out: _Collected, words: list[_Word], depth: int) -> None:
    out.argv(_options(words, flags="nLs", valued="Cu"), depth)


def _stdbuf(out: _Collected, words: list[_Word], depth: int) -> None:
    out.argv(_options(words, valued="ioe", long_valued=("input", "output", "error")), depth)


def _setsid(out: _Collected, words: list[_Word], depth: int) -> None:
    out.argv(_options(words, flags="cfw", long_flags=("ctty", "fork", "wait")), depth)


def _ionice(out: _Collected, words: list[_Word], depth: int) -> None:
    out.argv(_options(words, flags="t", valued="cnp"), depth)


def _time(out: _Collected, words: list[_Word], depth: int) -> None:
    out.argv(
        _options(
            words,
            flags="apqv",
            valued="fo",
            long_flags=("append", "portability", "quiet", "verbose"),
            long_valued=("format", "output"),
        ),
        depth,
    )


def _xargs(out: _Collected, words: list[_Word], depth: int) -> None:
    rest = _options(
        words,
        flags="0oprtx",
        valued="adEIiLlnPs",
        long_flags=("null", "open-tty", "interactive", "no-run-if-empty", "verbose", "exit"),
        long_valued=(
            "arg-file",
            "delimiter",
            "eof",
            "replace",
            "max-lines",
            "max-args",
            "max-procs",
            "max-chars",
            "process-slot-var",
        ),
    )
    out.argv(rest or [_Word("echo", "echo")], depth)


def _shell(out: _Collected, words: list[_Word], depth: int) -> None:
    script = False
    for w in words:
        value = w.value
        if value is None:
            raise _Unresolved(f"the argument {w.text!r} is computed")
        if value.startswith("-") and not value.startswith("--") and len(value) > 1:
            script = script or "c" in value[1:]
            continue
        if value.startswith(("+", "--")):
            continue
        if script:
            out.line(value, depth)
        return  # a script file (or stdin): judged by the shell's own subject


def _eval(out: _Collected, words: list[_Word], depth: int) -> None:
    if any(w.value is None for w in words):
        raise _Unresolved("its arguments are computed")
    out.line(" ".join(w.value or "" for w in words), depth)


def _find(out: _Collected, words: list[_Word], depth: int) -> None:
    paths: list[str] = []
    i = 0
    while i < len(words) and (words[i].value or "-")[0] not in "-(!":
        paths.append(words[i].shown)
        i += 1
    while i < len(words):
        value = words[i].value
        if value in ("-exec", "-execdir", "-ok", "-okdir"):
            end = i + 1
            while end < len(words) and words[end].value not in (";", "+"):
                end += 1
            out.argv(words[i + 1 : end], depth)
            i = end
        elif value == "-delete":
            out.commands.append(" ".join(["rm", *(paths or ["."])]))
        i += 1


_WRAPPERS: Final[dict[str, Wrapper]] = {
    "command": _command,
    "builtin": _run,
    "exec": _exec,
    "env": _env,
    "nice": _nice,
    "nohup": _run,
    "timeout": _timeout,
    "sudo": _sudo,
    "doas": _doas,
    "stdbuf": _stdbuf,
    "setsid": _setsid,
    "ionice": _ionice,
    "time": _time,
    "busybox": _run,
    "xargs": _xargs,
    "sh": _shell,
    "bash": _shell,
    "dash": _shell,
    "zsh": _shell,
    "ksh": _shell,
    "eval": _eval,
    "find": _find,
}
