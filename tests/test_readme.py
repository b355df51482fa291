"""The README's tour runs as written, against a real server, and its links stay inside."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from llm.fake_providers import FakeProvider, Reply, anthropic_text, openai_text
from serve_proc import serving

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
KEY = "sk-readme-0123456789SECRET"


def blocks(language: str) -> list[str]:
    """The README's fenced blocks of ``language``, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```$", README.read_text(), re.M | re.S)


def tour_step(number: int) -> str:
    text = README.read_text()
    start = text.index(f"### {number}. ")
    end = text.find("\n## ", start)
    following = text.find("\n### ", start + 1)
    return text[start : min(e for e in (end, following) if e != -1)]


def sh_blocks(section: str) -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```$", section, re.M | re.S)


def synced_and_succeeded(times: int) -> Callable[[str], bool]:
    """A followed log that has replayed and shows ``times`` executions succeeded."""
    return lambda seen: (
        "event: log.synced" in seen and seen.count("event: session.execution.succeeded") >= times
    )


async def bash(
    script: str, env: dict[str, str], *, until: Callable[[str], bool] | None = None
) -> str:
    """Runs ``script``; with ``until``, reads its output until that holds, then ends it."""
    proc = await asyncio.create_subprocess_exec(
        "bash", "-euo", "pipefail", "-c", script, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    if until is None:
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        return out.decode()
    seen = b""
    try:
        while not until(seen.decode(errors="replace")):
            chunk = await asyncio.wait_for(proc.stdout.read(65536), 60)
            assert chunk, f"the stream ended early: {seen.decode()}"
            seen += chunk
    finally:
        proc.kill()
        await proc.wait()
    return seen.decode()


def on_port(script: str, url: str) -> str:
    return script.replace("localhost:4096", url.removeprefix("http://"))


async def test_the_curl_tour_runs_as_written(tmp_path: Path) -> None:
    prompt_blocks = sh_blocks(tour_step(2))
    [follow] = sh_blocks(tour_step(3))
    create, transcript, directive = prompt_blocks
    env = {k: v for k, v in os.environ.items() if k != "SESSIONRT_SERVER_PASSWORD"}
    async with serving(tmp_path / "data", cwd=tmp_path) as served:
        out = await bash(on_port(create, served.url) + 'echo; echo "SID=$SID"\n', env)
        assert '"payload":{"text":"hello"}' in out
        env["SID"] = re.findall(r"^SID=(ses_\w+)$", out, re.M)[0]
        env["J"] = "content-type: application/json"

        first = await bash(on_port(follow, served.url), env, until=synced_and_succeeded(1))
        listed = await bash(on_port(transcript, served.url), env)
        await bash(on_port(directive, served.url), env)
        log = await bash(on_port(follow, served.url), env, until=synced_and_succeeded(2))

    assert "event: session.inbox.enqueued" in first
    assert '"text":"Scripted reply: hello"' in listed
    assert '"name":"bash"' in log
    assert "event: session.tool.success" in log
    assert '"text":"Listed."' in log.replace(" ", "")


@pytest.mark.parametrize(("kind", "variable"), [("openai", "LOCAL_API_KEY"),
                                                ("anthropic", "ANTHROPIC_API_KEY")])  # fmt: skip
async def test_the_model_configurations_run_against_their_wire_format(
    tmp_path: Path, kind: str, variable: str
) -> None:
    [toml] = [b for b in blocks("toml") if f'kind = "{kind}"' in b]
    model = re.findall(r'default_model = "[^/]+/(.+)"', toml)[0]
    async with FakeProvider() as fake:
        base = fake.openai_url if kind == "openai" else fake.anthropic_url
        config = tmp_path / "sessionrt.toml"
        config.write_text(re.sub(r'base_url = "[^"]*"', f'base_url = "{base}"', toml))
        text = openai_text(["From ", "your model."]) if kind == "openai" else None
        fake.replies.append(Reply.stream(text or anthropic_text(["From ", "your model."])))
        env = {**os.environ, variable: KEY}
        env.pop("SESSIONRT_SERVER_PASSWORD", None)
        async with (
            serving(tmp_path / "data", "--config", str(config), env=env, cwd=tmp_path) as served,
            aiohttp.ClientSession() as http,
        ):
            async with http.post(f"{served.url}/api/session", json={}) as response:
                sid = (await response.json())["data"]["id"]
            async with http.post(f"{served.url}/api/session/{sid}/prompt", json={"text": "hi"}):
                pass
            async with http.post(f"{served.url}/api/experimental/session/{sid}/wait") as response:
                assert response.status == 204
            async with http.get(f"{served.url}/api/session/{sid}/message") as response:
                messages = await response.text()

    assert '"text":"From your model."' in messages
    assert fake.received[0].body["model"] == model


async def test_the_embedding_example_runs_as_written(tmp_path: Path) -> None:
    [example] = re.findall(r"^```python\n(.*?)^```$", tour_step(5), re.M | re.S)
    (tmp_path / "tour.py").write_text(example)

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "tour.py", cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)

    assert proc.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    assert lines[0].startswith("msg_")
    assert lines[-1].endswith(" session.execution.succeeded")


def test_the_readme_stays_short_and_links_only_inside_the_repository() -> None:
    text = README.read_text()
    links = re.findall(r"\]\(([^)]+)\)", text)

    assert len(text.splitlines()) <= 300
    assert "../" not in text
    assert links, "the README links into docs/"
    missing = [link for link in links if not (ROOT / link.split("#")[0]).is_file()]
    assert missing == []


def test_the_docs_link_only_to_files_that_exist() -> None:
    broken = []
    for page in (ROOT / "docs").glob("*.md"):
        prose = re.sub(r"^```.*?^```$|`[^`\n]*`", "", page.read_text(), flags=re.M | re.S)
        for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", prose):
            if "://" not in link and not (page.parent / link).is_file():
                broken.append(f"{page.name}: {link}")

    assert broken == []


async def test_the_own_tools_example_runs_as_written(tmp_path: Path) -> None:
    [example] = re.findall(r"^```python\n(.*?)^```$", tour_step(6), re.M | re.S)
    (tmp_path / "tools.py").write_text(example)

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "tools.py", cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)

    assert proc.returncode == 0, err.decode()
    assert out.decode().startswith("convert completed")
    assert "8.50 EUR" in out.decode()
