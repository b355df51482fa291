"""The file-backed instruction sources, observed in one blocking call.

- **discovery** (``discovery/agents``): the data dir's ``AGENTS.md``, then each
  ``AGENTS.md`` from the project root (the nearest directory upward holding
  ``.git``; without one, the session's directory alone) down to the session's
  directory, nearest last. When the walk finds no ``AGENTS.md`` at all,
  ``CLAUDE.md`` files are taken the same way. One ordered aggregate value.
- **skills** (``skill/available``): ``SKILL.md`` under
  ``.sessionrt/skills/<name>/`` in the session's directory and under the data
  dir's ``skills/<name>/``; the project's wins by name. Only names and
  descriptions the agent may use are listed; bodies stay with the skill tool.
- **references** (``reference/<path>``): files the agent's configuration
  names, confined to the session's directory.

Project discovery (the upward AGENTS.md / CLAUDE.md walk) is off when the
runtime says so (``[runtime] project_instructions = false``) or when the
environment sets ``OPENCODE_DISABLE_PROJECT_CONFIG`` or its twin
``SESSIONRT_DISABLE_PROJECT_CONFIG`` to ``1`` or ``true``
(:func:`project_config_disabled`); the data dir's file is read either way.

A missing file is an observed absence. A file that exists but cannot be read
(permissions, a symlink loop, not UTF-8, over :data:`MAX_FILE_BYTES`) makes its
source *unavailable*: it blocks an initial baseline and otherwise keeps the
stored value. Texts are cached by ``(device, inode, mtime, size)`` so an
unchanged file is stat-ed, not read again; the cache is bounded by count and
bytes (:class:`FileCache`).
"""

from __future__ import annotations

import os
import re
import stat
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from actors.files.confine import PROJECT_CONFIG_DIR

__all__ = [
    "DISABLE_PROJECT_CONFIG_ENV",
    "DISCOVERY_KEY",
    "MAX_FILE_BYTES",
    "SKILLS_KEY",
    "FileCache",
    "FileSpec",
    "Observation",
    "Unreadable",
    "observe_files",
    "project_config_disabled",
    "project_walk",
    "reference_key",
]

DISCOVERY_KEY: Final = "discovery/agents"
SKILLS_KEY: Final = "skill/available"
#: A larger instruction file is not read (its source is unavailable).
MAX_FILE_BYTES: Final = 1024 * 1024
#: Environment switches that turn project discovery off (the glossary's name first).
DISABLE_PROJECT_CONFIG_ENV: Final = (
    "OPENCODE_DISABLE_PROJECT_CONFIG",
    "SESSIONRT_DISABLE_PROJECT_CONFIG",
)


def project_config_disabled(environ: Mapping[str, str]) -> bool:
    """Whether either switch is set to ``1`` or ``true`` (any case) in ``environ``."""
    return any(
        environ.get(name, "").strip().lower() in ("1", "true")
        for name in DISABLE_PROJECT_CONFIG_ENV
    )


_KEY_UNSAFE: Final = re.compile(r"[^a-z0-9._/-]+")


@attrs.frozen(kw_only=True)
class Observation:
    """What one source (a key, or a namespace ending in ``/``) holds now.

    ``unavailable`` maps a key (or the scope itself) to the reason it could
    not be read; those keys keep their stored values.
    """

    scope: str
    values: Mapping[str, Any] = attrs.field(factory=dict)
    unavailable: Mapping[str, str] = attrs.field(factory=dict)

    def covers(self, key: str) -> bool:
        return key == self.scope or (self.scope.endswith("/") and key.startswith(self.scope))


@attrs.frozen(kw_only=True)
class FileSpec:
    directory: str
    data_dir: str
    discover_project: bool = True
    references: tuple[str, ...] = ()
    #: Skill names the agent may use; None = every skill found.
    skills: tuple[str, ...] | None = None


class _Unreadable(Exception):
    pass


#: A file or directory that exists but cannot be read (its message says why).
Unreadable = _Unreadable


class FileCache:
    """Texts by path, valid while the file's stat signature is unchanged.

    Bounded: at most ``max_entries`` files and ``max_bytes`` of text; over
    either, it starts again empty. Shared by worker threads (a lock).
    """

    def __init__(self, max_entries: int = 1024, max_bytes: int = 32 * 1024 * 1024) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._texts: dict[str, tuple[tuple[int, int, int, int], str]] = {}
        self._dirs: dict[str, tuple[tuple[int, int, int], list[str]]] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def listdir(self, name: str) -> list[str] | None:
        """The sorted entries of a directory; None when there is none.

        Reused while the directory's own mtime is unchanged (an entry added or
        removed changes it); at most ``max_entries`` directories are kept.
        """
        try:
            st = os.stat(name)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise _Unreadable(f"{name}: {exc.strerror or exc}") from None
        if not stat.S_ISDIR(st.st_mode):
            return None
        signature = (st.st_dev, st.st_ino, st.st_mtime_ns)
        with self._lock:
            hit = self._dirs.get(name)
        if hit is not None and hit[0] == signature:
            return hit[1]
        try:
            names = sorted(os.listdir(name))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise _Unreadable(f"{name}: {exc.strerror or exc}") from None
        with self._lock:
            if len(self._dirs) >= self.max_entries:
                self._dirs.clear()
            self._dirs[name] = (signature, names)
        return names

    def read(self, name: str) -> str | None:
        """The file's text; None when nothing (or no regular file) is there."""
        try:
            st = os.stat(name)
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            return None
        except OSError as exc:
            raise _Unreadable(f"{name}: {exc.strerror or exc}") from None
        if not stat.S_ISREG(st.st_mode):
            return None
        signature = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        with self._lock:
            hit = self._texts.get(name)
        if hit is not None and hit[0] == signature:
            return hit[1]
        if st.st_size > MAX_FILE_BYTES:
            raise _Unreadable(f"{name}: larger than {MAX_FILE_BYTES} bytes")
        try:
            with open(name, "rb") as f:
                text = f.read(MAX_FILE_BYTES + 1).decode("utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _Unreadable(f"{name}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise _Unreadable(f"{name}: not UTF-8 text") from None
        with self._lock:
            if len(self._texts) >= self.max_entries or self._bytes + len(text) > self.max_bytes:
                self._texts.clear()
                self._bytes = 0
            old = self._texts.get(name)
            if old is not None:
                self._bytes -= len(old[1])
            self._texts[name] = (signature, text)
            self._bytes += len(text)
        return text


def observe_files(spec: FileSpec, cache: FileCache) -> list[Observation]:
    """Blocking: the discovery, skill and reference observations for ``spec``."""
    return [_discovery(spec, cache), _skills(spec, cache), _references(spec, cache)]


def _project_dirs(directory: str) -> list[str]:
    """From the project root (nearest ``.git`` upward) down to ``directory``."""
    return project_walk(directory)[1]


def project_walk(directory: str) -> tuple[list[str], list[str]]:
    """(every directory the walk looks in for ``.git``, from ``directory`` upward;
    the project's directories from its root down to ``directory``)."""
    walked: list[str] = []
    current = directory
    while True:
        walked.append(current)
        if os.path.exists(os.path.join(current, ".git")):
            return walked, walked[::-1]
        parent = os.path.dirname(current)
        if parent == current:
            return walked, [directory]
        current = parent


def _discovery(spec: FileSpec, cache: FileCache) -> Observation:
    # Plain strings and os.path: this runs before every step, and pathlib's
    # parsing cost more than the system calls.
    files: list[dict[str, str]] = []
    try:
        path = os.path.join(spec.data_dir, "AGENTS.md")
        text = cache.read(path)
        if text is not None:
            files.append({"path": path, "text": text})
        if spec.discover_project:
            dirs = _project_dirs(spec.directory)
            for name in ("AGENTS.md", "CLAUDE.md"):
                found = []
                for d in dirs:
                    path = os.path.join(d, name)
                    text = cache.read(path)
                    if text is not None:
                        found.append({"path": path, "text": text})
                if found:
                    files.extend(found)
                    break
    except _Unreadable as exc:
        return Observation(scope=DISCOVERY_KEY, unavailable={DISCOVERY_KEY: str(exc)})
    return Observation(scope=DISCOVERY_KEY, values={DISCOVERY_KEY: files} if files else {})


def _frontmatter(text: str) -> dict[str, str]:
    if not text.startswith("---"):
        return {}
    end = text.find("\n---", 3)
    if end < 0:
        return {}
    out: dict[str, str] = {}
    for line in text[3:end].splitlines():
        name, sep, value = line.partition(":")
        if sep:
            out[name.strip()] = value.strip().strip("'\"")
    return out


def _skills(spec: FileSpec, cache: FileCache) -> Observation:
    found: dict[str, str] = {}
    roots = (
        os.path.join(spec.data_dir, "skills"),
        os.path.join(spec.directory, PROJECT_CONFIG_DIR, "skills"),
    )
    try:
        for root in roots:  # the project's, read last, wins by name
            names = cache.listdir(root)
            for entry in names or ():
                text = cache.read(os.path.join(root, entry, "SKILL.md"))
                if text is None:
                    continue
                meta = _frontmatter(text)
                name = meta.get("name") or entry
                found[name] = meta.get("description", "")
    except _Unreadable as exc:
        return Observation(scope=SKILLS_KEY, unavailable={SKILLS_KEY: str(exc)})
    allowed = found if spec.skills is None else {n: found[n] for n in spec.skills if n in found}
    listed = [{"name": n, "description": allowed[n]} for n in sorted(allowed)]
    return Observation(scope=SKILLS_KEY, values={SKILLS_KEY: listed} if listed else {})


def reference_key(raw: str) -> str:
    """``reference/<path>`` with the path lowered to the key alphabet."""
    rest = _KEY_UNSAFE.sub("-", raw.lower().replace("\\", "/")).strip("-/.") or "file"
    return f"reference/{rest}"


def _references(spec: FileSpec, cache: FileCache) -> Observation:
    values: dict[str, Any] = {}
    unavailable: dict[str, str] = {}
    root = os.path.realpath(spec.directory)
    for raw in spec.references:
        key = reference_key(raw)
        if key in values or key in unavailable:
            continue
        try:
            # Where it really leads (symlinks followed), inside the Location only.
            path = os.path.realpath(os.path.join(root, raw))
            if os.path.commonpath((root, path)) != root:
                unavailable[key] = f"reference {raw}: outside the session's directory ({root})"
                continue
            text = cache.read(path)
        except ValueError as exc:  # a NUL byte
            unavailable[key] = f"reference {raw}: {exc}"
            continue
        except _Unreadable as exc:
            unavailable[key] = str(exc)
            continue
        if text is not None:
            values[key] = {"path": raw, "text": text}
    return Observation(scope="reference/", values=values, unavailable=unavailable)


def builtin_values(*, system: str, directory: str, platform: str, date: str) -> dict[str, Any]:
    values: dict[str, Any] = {
        "builtin/environment": {"directory": directory, "platform": platform, "date": date}
    }
    if system:
        values["builtin/agent"] = system
    return values


def entry_values(entries: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    return {f"api/{k}": v for k, v in entries}
