"""Dependencies point one way: protocol <- storage <- actors <- server; backends stay in storage."""

from __future__ import annotations

import ast
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

LAYERS = ["protocol", "storage", "actors", "server"]
ROOT = Path(__file__).resolve().parent.parent

#: Every module that belongs to one backend (a package: every module in it).
#: The rest of storage/ serves both.
BACKEND_MODULES = (
    "storage.sqlite",
    "storage._writer",
    "storage._inline_reads",
    "storage.rebuild",
    "storage.postgres",
)
#: The drivers: a module that imports one speaks to a backend.
DRIVERS = ("sqlite3", "aiosqlite", "asyncpg", "psycopg")
#: Where a backend is chosen: they import backends (lazily, for PostgreSQL) by design.
DOORS = ("storage", "storage.connect")


@pytest.mark.parametrize("index", range(len(LAYERS)))
def test_a_layer_imports_nothing_above_it(index: int) -> None:
    package, above = LAYERS[index], LAYERS[index + 1 :]
    probe = (
        f"import sys, pkgutil, importlib, {package}\n"
        f"for m in pkgutil.walk_packages({package}.__path__, '{package}.'):\n"
        "    importlib.import_module(m.name)\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {above!r})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == ""


def _within(name: str, modules: tuple[str, ...] | set[str]) -> bool:
    return any(name == m or name.startswith(m + ".") for m in modules)


def _modules(package: str) -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import anywhere in ``path`` (in functions too); for
    ``from a import b``, both ``a`` and ``a.b`` (``b`` may be a module)."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


@cache
def _speaking_to_a_backend() -> frozenset[str]:
    """Modules of storage/ (but the doors) that import a driver or a backend module."""
    modules = _modules("storage")
    found = {m for m in modules if _within(m, BACKEND_MODULES)}
    while True:
        more = {
            m
            for m, path in modules.items()
            if m not in found
            and m not in DOORS
            and any(_within(i, DRIVERS) or _within(i, found) for _, i in _imports(path))
        }
        if not more:
            return frozenset(found)
        found |= more


def test_every_module_that_speaks_to_a_backend_is_named_as_one() -> None:
    """A storage module that imports a driver or a backend module is one backend's:
    it belongs under its backend (storage/postgres/ …), and is named here."""
    unnamed = sorted(m for m in _speaking_to_a_backend() if not _within(m, BACKEND_MODULES))
    assert unnamed == []
    assert all(_within(m, set(_modules("storage"))) for m in BACKEND_MODULES)


@cache
def _backend_names() -> frozenset[str]:
    """Names the doors re-export from a backend module (``SQLiteStore`` …)."""
    import storage

    return frozenset(
        name
        for name in storage.__all__
        if _within(getattr(getattr(storage, name), "__module__", "") or "", BACKEND_MODULES)
    )


@pytest.mark.parametrize("package", ["actors", "server"])
def test_actors_and_server_import_no_backend(package: str) -> None:
    """Above ``storage`` only the Protocols, ``storage.connect`` and the neutral
    modules may be named: never a backend module, nor what the package
    re-exports from one."""
    backends = set(_speaking_to_a_backend()) | set(BACKEND_MODULES)
    names = _backend_names() | {"PostgresStore"}
    bad: list[str] = []
    for path in _modules(package).values():
        where = f"{path.relative_to(ROOT)}"
        for line, imported in _imports(path):
            if _within(imported, backends) or imported.rpartition(".")[2] in names:
                bad.append(f"{where}:{line} {imported}")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in names:
                bad.append(f"{where}:{node.lineno} .{node.attr}")
    assert sorted(set(bad)) == []


#: The actor kit: the floor of ``actors/``, which knows nothing about sessions.
KIT = "actors.kit"


def test_the_actor_kit_imports_nothing_above_protocol() -> None:
    """``actors/kit/`` (actor, ref, mailbox, registry, exceptions, blocking, shield)
    builds on the standard library and ``protocol`` alone; the rest of ``actors/``
    builds on it."""
    modules = _modules("actors")
    assert KIT in modules
    bad = [
        f"{path.relative_to(ROOT)}:{line} {imported}"
        for module, path in modules.items()
        if _within(module, {KIT})
        for line, imported in _imports(path)
        if imported.split(".")[0] in LAYERS[1:] and not _within(imported, {KIT})
    ]
    assert bad == []
