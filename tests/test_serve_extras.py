"""scripts/serve installs an extra only when its arguments or --config file need it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from scripts_loader import load_script

ROOT = Path(__file__).resolve().parents[1]


def test_the_defaults_need_no_extra() -> None:
    extras = load_script("_serve_extras").extras

    assert extras([]) == []
    assert extras(["--port", "4097", "--database", "/srv/db.sqlite"]) == []


def test_a_postgresql_database_needs_the_driver_by_flag_or_file(tmp_path: Path) -> None:
    extras = load_script("_serve_extras").extras
    config = tmp_path / "sessionrt.toml"
    config.write_text('[runtime]\ndatabase = "postgresql://sessionrt@db/sessionrt"\n')

    assert extras(["--database", "postgresql://db/x"]) == ["postgres"]
    assert extras(["--database=postgres://db/x"]) == ["postgres"]
    assert extras(["--config", str(config)]) == ["postgres"]
    # The flag wins over the file, as it does in serve.
    assert extras(["--config", str(config), "--database", "/tmp/x.sqlite"]) == []


def test_a_file_it_cannot_read_adds_nothing_and_serve_says_why(tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("[runtime\n")

    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "_serve_extras.py"), "--config", str(broken)],
        capture_output=True,
        text=True,
        check=True,
    )

    assert done.stdout == "\n"
    assert load_script("_serve_extras").extras(["--config", str(tmp_path / "missing.toml")]) == []


def test_mcp_servers_in_the_file_need_the_sdk(tmp_path: Path) -> None:
    config = tmp_path / "sessionrt.toml"
    config.write_text('[mcp.files]\ncommand = ["python", "-m", "x"]\n')
    assert load_script("_serve_extras").extras(["--config", str(config)]) == ["mcp"]
