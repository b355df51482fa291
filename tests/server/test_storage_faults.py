"""The database failing underneath a running server: a real fault, a tagged 503.

``sessionrt serve`` runs as a subprocess whose file-size limit
(``RLIMIT_FSIZE``) is a little over what its database starts with, so SQLite's
writes really fail (EFBIG: the same path as a full disk) after a few prompts.
"""

from __future__ import annotations

import asyncio
import resource
import signal
from pathlib import Path

import aiohttp
import pytest
from serve_proc import serving

LIMIT = 1_500_000


def _small_disk() -> None:  # runs in the child before exec
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a core dump
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


@pytest.mark.slow
async def test_a_full_disk_is_a_retryable_503_and_one_log_line(tmp_path: Path) -> None:
    async with serving(tmp_path / "data", preexec_fn=_small_disk) as served:
        url, proc = served.url, served.proc
        answers: list[tuple[int, str | None]] = []
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{url}/api/session", json={}) as response:
                sid = (await response.json())["data"]["id"]
            for _ in range(40):
                async with http.post(
                    f"{url}/api/session/{sid}/prompt", json={"text": "x" * 100_000}
                ) as response:
                    body = await response.json()
                    answers.append((response.status, body.get("_tag")))
                    if response.status == 503:
                        assert response.headers["Retry-After"]
            # Reads still work on a full disk.
            async with http.get(f"{url}/api/session/{sid}") as response:
                assert response.status == 200
        assert all(status in (200, 503) for status, _ in answers), answers
        refused = [tag for status, tag in answers if status == 503]
        assert refused
        assert set(refused) == {"StorageUnavailableError"}
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    text = err.decode()
    assert "Traceback" not in text, text
    assert text.count("storage unavailable") == 1, text
