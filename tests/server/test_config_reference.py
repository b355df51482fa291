"""docs/configuration.md is the attrs classes' reference, key for key, and cannot drift."""

from __future__ import annotations

from pathlib import Path

import attrs
from scripts_loader import load_script

from actors.runtime import RuntimeConfig
from server.app import ServerSettings
from server.config import FILE_KEYS, load_config

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_reference_is_what_the_generator_writes() -> None:
    gen = load_script("gen_config_doc")

    fresh = gen.render()

    assert fresh == (ROOT / "docs" / "configuration.md").read_text(), (
        "docs/configuration.md is stale: run .venv/bin/python scripts/gen_config_doc.py"
    )
    assert gen.main(["--check"]) == 0


def test_every_key_a_file_may_set_fills_a_field_of_its_class() -> None:
    gen = load_script("gen_config_doc")
    server_fields = set(attrs.fields_dict(ServerSettings)) | set(gen.SERVE_KEYS)

    assert set(FILE_KEYS["server"]) == server_fields
    assert set(FILE_KEYS["runtime"]) <= set(attrs.fields_dict(RuntimeConfig))


def test_every_row_of_the_reference_says_what_its_key_means() -> None:
    gen = load_script("gen_config_doc")
    rows = [*gen.server_rows(), *gen.runtime_rows(), *gen.python_only_rows()]

    empty = [key for key, _type, _default, meaning in rows if not meaning.strip()]

    assert empty == []
    assert len(rows) == len(attrs.fields(RuntimeConfig)) + len(FILE_KEYS["server"])


def test_a_file_setting_every_documented_key_loads(tmp_path: Path) -> None:
    gen = load_script("gen_config_doc")
    sample = {
        "boolean": "true",
        "integer": "7",
        "number": "1.5",
        "string": '"x"',
        "list of strings": '["a"]',
    }
    special = {"synchronous": '"NORMAL"', "default_model": '"scripted/scripted"'}
    lines = []
    for section, rows in (("server", gen.server_rows()), ("runtime", gen.runtime_rows())):
        lines.append(f"[{section}]")
        for key, toml_type, _default, _meaning in rows:
            lines.append(f"{key} = {special.get(key) or sample[toml_type.split(' `')[0]]}")
    config = tmp_path / "every.toml"
    config.write_text("\n".join(lines) + "\n")

    loaded = load_config(config)

    assert set(loaded["server"]) == set(FILE_KEYS["server"])
    assert set(loaded["runtime"]) == set(FILE_KEYS["runtime"])
