"""The console script, run as a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def sessionrt(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("sessionrt")
    return subprocess.run(
        [str(exe), *args], capture_output=True, text=True, timeout=60, env=env, check=False
    )


def test_serve_creates_and_reports_the_database(tmp_path: Path) -> None:
    data = tmp_path / "data"
    done = sessionrt("serve", "--data-dir", str(data))
    assert done.returncode == 0, done.stderr
    assert (data / "sessionrt.sqlite").exists()
    assert "0 sessions, 0 events" in done.stdout


def test_serve_defaults_to_the_xdg_data_home(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path)}
    done = sessionrt("serve", env=env)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "sessionrt" / "sessionrt.sqlite").exists()


def test_an_unusable_data_dir_is_a_clean_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    done = sessionrt("serve", "--data-dir", str(blocker / "sub"))
    assert done.returncode != 0
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("args", [(), ("bogus",)])
def test_usage_errors(args: tuple[str, ...]) -> None:
    done = sessionrt(*args)
    assert done.returncode == 2
    assert "usage" in done.stderr
