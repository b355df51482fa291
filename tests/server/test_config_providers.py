"""``[providers.*]`` and ``runtime.default_model`` in the config file: parsed or refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.llm import ModelLimits, ProviderConfig
from protocol.shapes import ModelRef
from server.config import ConfigError, load_config, runtime_config

GOOD = """
[providers.local]
kind = "openai"                        # or "anthropic"
base_url = "http://127.0.0.1:8000/v1"
api_key_env = "LOCAL_API_KEY"
headers = { "x-extra" = "1" }

[providers.local.models.fake-model]
context = 128000
output = 4096

[runtime]
default_model = "local/fake-model"
"""


def test_the_documented_shape_parses(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(GOOD)
    loaded = load_config(path)
    assert loaded["providers"] == {
        "local": ProviderConfig(
            id="local",
            kind="openai",
            base_url="http://127.0.0.1:8000/v1",
            api_key_env="LOCAL_API_KEY",
            headers={"x-extra": "1"},
            models={"fake-model": ModelLimits(context=128000, output=4096)},
        )
    }
    config = runtime_config(loaded, None, fallback_data_dir=tmp_path)
    assert config.default_model == ModelRef(id="fake-model", provider_id="local")
    assert config.provider_configs == loaded["providers"]
    assert config.data_dir == tmp_path


def test_the_key_is_never_part_of_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCAL_API_KEY", "sk-secret-value")
    path = tmp_path / "c.toml"
    path.write_text(GOOD)
    provider = load_config(path)["providers"]["local"]
    assert "sk-secret-value" not in repr(provider)
    assert provider.api_key() == "sk-secret-value"  # read at the call


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ('[providers.p]\nkind = "gemini"\nbase_url = "http://x"\n', "providers.p.kind"),
        ('[providers.p]\nkind = "openai"\nbase_url = "ftp://x"\n', "providers.p.base_url"),
        ('[providers.p]\nkind = "openai"\nbase_url = "http://x"\nkey = "k"\n', "providers.p.key"),
        (
            '[providers.p]\nkind = "openai"\nbase_url = "http://x"\nheaders = { a = 1 }\n',
            "providers.p.headers",
        ),
        (
            '[providers.p]\nkind = "openai"\nbase_url = "http://x"\n'
            "[providers.p.models.m]\ncontext = 0\noutput = 1\n",
            "providers.p.models.m.context",
        ),
        (
            '[providers.scripted]\nkind = "openai"\nbase_url = "http://x"\n',
            "built-in",
        ),
        ('[runtime]\ndefault_model = "nowhere/m"\n', "no [providers.*] table"),
        ('[runtime]\ndefault_model = "bare"\n', "PROVIDER/MODEL"),
        (
            '[providers.p]\nkind = "openai"\nbase_url = "http://x"\n'
            '[runtime]\ndefault_model = "p/missing"\n',
            "has no model 'missing'",
        ),
    ],
)
def test_mistakes_are_named(tmp_path: Path, text: str, complaint: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=complaint.replace("[", r"\[").replace("*", r"\*")):
        load_config(path)


def test_the_scripted_model_may_be_the_default(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[runtime]\ndefault_model = "scripted/scripted"\n')
    assert load_config(path)["runtime"]["default_model"] == ModelRef(
        id="scripted", provider_id="scripted"
    )
