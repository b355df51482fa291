"""actors.files.confined: every operation below a directory made through descriptors."""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

import pytest

from actors.files.confined import ConfinedDir, Entry, Refused, apply_entries, check_entries

BLOBS = {"one": b"first\n", "two": b"second\n", "lnk": b"../outside"}


def _write(oid: str, out: BinaryIO) -> None:
    out.write(BLOBS[oid])


def _read(oid: str) -> bytes:
    return BLOBS[oid]


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    base, outside = tmp_path / "base", tmp_path / "outside"
    base.mkdir()
    outside.mkdir()
    (outside / "f").write_text("secret\n")
    return base, outside


@pytest.mark.parametrize("name", ["", "/abs", "../x", "a/../b", "a//b", "./a", "a/."])
def test_a_path_that_is_not_plainly_inside_is_refused(layout: tuple[Path, Path], name: str) -> None:
    base, _ = layout
    with ConfinedDir(str(base)) as tree, pytest.raises(Refused):
        tree.lstat(name)


def test_a_write_never_goes_through_a_symlinked_parent(layout: tuple[Path, Path]) -> None:
    base, outside = layout
    (base / "d").symlink_to("../outside")
    with ConfinedDir(str(base)) as tree:
        with pytest.raises(Refused):
            tree.write("d/f", "file", lambda out: out.write(b"pwned"))
        assert tree.lstat("d/f") is None  # not inside: behind a symlink
        assert tree.remove("d/f") is False
    assert (outside / "f").read_text() == "secret\n"


def test_a_hard_link_is_replaced_not_written_through(layout: tuple[Path, Path]) -> None:
    base, outside = layout
    os.link(outside / "f", base / "linked")
    with ConfinedDir(str(base)) as tree:
        apply_entries(tree, {"linked": Entry(kind="file", oid="one")}, _write, _read)
    assert (base / "linked").read_bytes() == b"first\n"
    assert (outside / "f").read_text() == "secret\n"


def test_the_forbidden_directory_is_refused_whatever_leads_there(
    layout: tuple[Path, Path],
) -> None:
    base, _ = layout
    data = base / "data"
    data.mkdir()
    (data / "db").write_text("live\n")
    with ConfinedDir(str(base), forbidden=[str(data)]) as tree:
        with pytest.raises(Refused):
            tree.remove("data/db")
        with pytest.raises(Refused):
            check_entries(tree, {"data/db": Entry(kind=None)})
    assert (data / "db").read_text() == "live\n"
    with pytest.raises(Refused):
        ConfinedDir(str(data), forbidden=[str(data)])


def test_symlinks_come_last_so_nothing_leads_through_one_the_plan_made(
    layout: tuple[Path, Path],
) -> None:
    base, outside = layout
    (base / "d").mkdir()
    (base / "d" / "f").write_text("x\n")
    plan = {
        "d": Entry(kind="link", oid="lnk"),
        "d/f": Entry(kind=None),
        "e": Entry(kind="exec", oid="two"),
    }
    with ConfinedDir(str(base)) as tree:
        check_entries(tree, plan)
        apply_entries(tree, plan, _write, _read)
    assert os.readlink(base / "d") == "../outside"
    assert (outside / "f").read_text() == "secret\n"
    assert (base / "e").read_bytes() == b"second\n"
    assert os.access(base / "e", os.X_OK)


def test_a_directory_holding_other_files_cannot_become_a_file(layout: tuple[Path, Path]) -> None:
    base, _ = layout
    (base / "d").mkdir()
    (base / "d" / "f").write_text("x\n")
    (base / "d" / "mine").write_text("kept\n")
    plan = {"d": Entry(kind="link", oid="lnk"), "d/f": Entry(kind=None)}
    with ConfinedDir(str(base)) as tree, pytest.raises(Refused):
        check_entries(tree, plan)
    assert (base / "d" / "mine").read_text() == "kept\n"
