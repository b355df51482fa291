from __future__ import annotations

import threading

import pytest

from protocol import InvalidRequestError, ids


def test_ids_carry_their_prefix() -> None:
    assert ids.session_id().startswith("ses_")
    assert ids.message_id().startswith("msg_")
    assert ids.event_id().startswith("evt_")
    assert ids.tool_output_id().startswith("tool_")


def test_ids_strictly_increase_inside_one_millisecond() -> None:
    minted = [ids.message_id() for _ in range(20_000)]
    assert minted == sorted(minted)
    assert len(set(minted)) == len(minted)


def test_ids_strictly_increase_across_threads() -> None:
    out: list[list[str]] = [[] for _ in range(4)]

    def mint(bucket: list[str]) -> None:
        bucket.extend(ids.event_id() for _ in range(2_000))

    threads = [threading.Thread(target=mint, args=(b,)) for b in out]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for bucket in out for i in bucket]
    assert len(set(every)) == len(every)
    for bucket in out:
        assert bucket == sorted(bucket)


@pytest.mark.parametrize(
    ("kind", "value"),
    [("ses", "msg_abc"), ("msg", "ses_abc"), ("msg", "msg_"), ("ses", "ses_a b"), ("ses", 12)],
)
def test_validate_rejects_wrong_ids(kind: ids.IdKind, value: object) -> None:
    with pytest.raises(InvalidRequestError) as info:
        ids.validate(kind, value, field="id")
    assert info.value.fields == {"kind": "id", "field": "id"}
    assert info.value.status == 400


def test_validate_accepts_client_ids_of_other_layouts() -> None:
    assert ids.validate("ses", "ses_client-chosen_1", field="id") == "ses_client-chosen_1"
