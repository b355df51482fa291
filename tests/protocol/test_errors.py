from __future__ import annotations

import pytest

from protocol import errors


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (errors.InvalidRequestError("bad", field="x"), 400),
        (errors.InvalidCursorError(), 400),
        (errors.UnauthorizedError(), 401),
        (errors.ForbiddenError("no"), 403),
        (errors.SessionNotFoundError("ses_1"), 404),
        (errors.MessageNotFoundError("ses_1", "msg_1"), 404),
        (errors.PermissionNotFoundError("ses_1", "per_1"), 404),
        (errors.ConflictError("taken", resource="inbox"), 409),
        (errors.RouteNotFoundError("no route"), 404),
        (errors.MethodNotAllowedError("no"), 405),
        (errors.SessionBusyError("ses_1"), 409),
        (errors.InstructionEntryValueTooLargeError(10, 5), 413),
        (errors.PayloadTooLargeError(5), 413),
        (errors.UnsupportedMediaTypeError("text/plain"), 415),
        (errors.MisdirectedRequestError("evil.example"), 421),
        (errors.StorageUnavailableError("disk full"), 503),
        (errors.UnknownError(ref="r1"), 500),
        (errors.ServiceUnavailableError(service="store"), 503),
    ],
)
def test_every_tag_round_trips_through_its_wire_form(
    error: errors.DomainError, status: int
) -> None:
    assert error.status == status
    wire = error.to_wire()
    assert wire["_tag"] == error.tag
    assert wire["message"]
    back = errors.from_wire(wire)
    assert back == error
    assert type(back) is type(error)


def test_fields_use_wire_names_and_omit_unset() -> None:
    err = errors.MessageNotFoundError("ses_1", "msg_2")
    assert err.to_wire() == {
        "_tag": "MessageNotFoundError",
        "message": "Message not found: msg_2",
        "sessionID": "ses_1",
        "messageID": "msg_2",
    }
    assert errors.ConflictError("x").to_wire() == {"_tag": "ConflictError", "message": "x"}


def test_unknown_tag_is_not_ours() -> None:
    assert errors.from_wire({"_tag": "Nope", "message": "?"}) is None


def test_tags_are_unique() -> None:
    registry = errors.error_types()
    assert len(registry) == 20
    assert all(issubclass(cls, errors.SessionRtError) for cls in registry.values())
