"""A data dir that cannot be one is refused in a sentence, by every host of the runtime."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.runtime import DB_NAME, Runtime, RuntimeConfig
from protocol.errors import InvalidRequestError
from server.embedded import Embedded


@pytest.mark.parametrize("under", [False, True], ids=["is-a-file", "under-a-file"])
async def test_the_runtime_refuses_a_data_dir_that_is_a_file(tmp_path: Path, under: bool) -> None:
    blocker = tmp_path / "data"
    blocker.write_text("not a directory")
    data_dir = blocker / "inner" if under else blocker
    with pytest.raises(InvalidRequestError) as caught:
        async with Runtime(RuntimeConfig(data_dir=data_dir)):
            pass
    assert caught.value.fields["field"] == "runtime.data_dir"
    assert str(blocker) in caught.value.message
    assert "Errno" not in caught.value.message
    assert blocker.read_text() == "not a directory"


async def test_the_embedded_host_refuses_it_too(tmp_path: Path) -> None:
    (tmp_path / "data").write_text("x")
    with pytest.raises(InvalidRequestError, match="is not a directory"):
        async with Embedded(data_dir=tmp_path / "data"):
            pass


@pytest.mark.sqlite_only
async def test_a_missing_data_dir_is_made_with_its_parents(tmp_path: Path) -> None:
    data_dir = tmp_path / "a" / "b" / "data"
    async with Runtime(RuntimeConfig(data_dir=data_dir)) as rt:
        assert (await rt.sessions.create()).id
    assert (data_dir / DB_NAME).is_file()
