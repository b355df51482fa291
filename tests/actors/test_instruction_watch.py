"""The instruction observation cache: served again only while inotify reports nothing it read."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from actors.instructions._sources import FileCache, FileSpec, Observation, observe_files
from actors.instructions._watch import ObservationCache

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="inotify is Linux's")


@pytest.fixture
def cache() -> ObservationCache:
    c = ObservationCache()
    c.open()
    assert c.enabled
    yield c
    c.close()


def _layout(tmp_path: Path) -> FileSpec:
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)
    (project / "AGENTS.md").write_text("be brief")
    work = project / "src" / "app"
    work.mkdir(parents=True)
    data = tmp_path / "data"
    (data / "skills" / "review").mkdir(parents=True)
    (data / "skills" / "review" / "SKILL.md").write_text("---\nname: review\n---\nbody")
    return FileSpec(directory=str(work), data_dir=str(data))


def _observe(cache: ObservationCache, spec: FileSpec) -> list[Observation]:
    begun = cache.begin()
    files = observe_files(spec, FileCache())
    cache.store(spec, begun, files)
    return files


def _settled(cache: ObservationCache, spec: FileSpec) -> list[Observation]:
    """Observe until the cache serves it (the first observation registers the watches)."""
    for _ in range(3):
        files = _observe(cache, spec)
        hit = cache.lookup(spec)
        if hit is not None:
            assert hit == files
            return hit
    raise AssertionError("never served from the cache")


def _agents(files: list[Observation]) -> list[str]:
    [discovery] = [o for o in files if o.scope == "discovery/agents"]
    return [f["text"] for f in discovery.values.get("discovery/agents", [])]


def test_served_again_until_a_file_it_read_changes(tmp_path: Path, cache: ObservationCache) -> None:
    spec = _layout(tmp_path)
    assert cache.lookup(spec) is None  # never observed
    first = _observe(cache, spec)
    assert cache.lookup(spec) is None  # its watches were new: not trusted yet
    assert _agents(_settled(cache, spec)) == ["be brief"] == _agents(first)
    assert _agents(cache.lookup(spec) or []) == ["be brief"]
    (tmp_path / "project" / "AGENTS.md").write_text("be thorough")  # same size, same second
    assert cache.lookup(spec) is None
    assert _agents(_settled(cache, spec)) == ["be thorough"]


def test_writes_to_names_it_did_not_read_change_nothing(
    tmp_path: Path, cache: ObservationCache
) -> None:
    spec = _layout(tmp_path)
    _settled(cache, spec)
    (Path(spec.data_dir) / "sessionrt.db-wal").write_bytes(b"x" * 100)
    (tmp_path / "project" / "README.md").write_text("docs")
    (Path(spec.directory) / "main.py").write_text("print()")
    assert cache.lookup(spec) is not None


def test_a_new_agents_md_nearer_the_session_or_a_new_skill_is_seen(
    tmp_path: Path, cache: ObservationCache
) -> None:
    spec = _layout(tmp_path)
    _settled(cache, spec)
    (Path(spec.directory) / "AGENTS.md").write_text("nearest")
    assert cache.lookup(spec) is None
    assert _agents(_settled(cache, spec)) == ["be brief", "nearest"]
    (Path(spec.data_dir) / "skills" / "deploy").mkdir()
    assert cache.lookup(spec) is None
    _settled(cache, spec)
    (Path(spec.data_dir) / "skills" / "deploy" / "SKILL.md").write_text("---\nname: deploy\n---")
    assert cache.lookup(spec) is None


def test_a_replaced_directory_on_the_path_is_seen_and_watched_anew(
    tmp_path: Path, cache: ObservationCache
) -> None:
    spec = _layout(tmp_path)
    _settled(cache, spec)
    src = tmp_path / "project" / "src"
    os.rename(src, tmp_path / "project" / "old-src")
    (src / "app").mkdir(parents=True)
    assert cache.lookup(spec) is None
    assert _agents(_settled(cache, spec)) == ["be brief"]
    (src / "app" / "AGENTS.md").write_text("in the new tree")  # seen: watched anew
    assert cache.lookup(spec) is None
    assert _agents(_settled(cache, spec)) == ["be brief", "in the new tree"]


def test_symlinked_sources_and_references_are_observed_every_time(
    tmp_path: Path, cache: ObservationCache
) -> None:
    spec = _layout(tmp_path)
    target = tmp_path / "elsewhere.md"
    target.write_text("linked")
    (Path(spec.directory) / "AGENTS.md").symlink_to(target)
    for _ in range(3):
        _observe(cache, spec)
        assert cache.lookup(spec) is None
    referencing = FileSpec(
        directory=str(tmp_path / "project"), data_dir=spec.data_dir, references=("AGENTS.md",)
    )
    for _ in range(3):
        _observe(cache, referencing)
        assert cache.lookup(referencing) is None


def test_a_change_while_observing_is_not_served_as_fresh(
    tmp_path: Path, cache: ObservationCache
) -> None:
    spec = _layout(tmp_path)
    _settled(cache, spec)
    (tmp_path / "project" / "AGENTS.md").write_text("v2")
    begun = cache.begin()  # taken before the events are read: the observation is stale
    files = observe_files(spec, FileCache())
    (tmp_path / "project" / "AGENTS.md").write_text("v3")  # after it read the file
    cache.store(spec, begun, files)
    assert cache.lookup(spec) is None
