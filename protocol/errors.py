"""Tagged domain errors, shared by the runtime, the server and the client.

Every error that crosses the public boundary is a :class:`DomainError` with a
wire tag (``_tag``), an HTTP status and a few named fields. The server turns
them into ``{"_tag": …, "message": …, …fields}`` with the tag's status; the
client turns such a body back into the same class with :func:`from_wire`.

    SessionRtError                      base of everything we raise on purpose
    └── DomainError                     tagged, has an HTTP status
        ├── InvalidRequestError         400  the caller sent something malformed
        ├── InvalidCursorError          400  a cursor failed to decode or is misused
        ├── UnauthorizedError           401
        ├── ForbiddenError              403
        ├── SessionNotFoundError        404  (sessionID)
        ├── MessageNotFoundError        404  (sessionID, messageID)
        ├── RouteNotFoundError          404  no such route
        ├── MethodNotAllowedError       405  the route exists, not with this method
        ├── RequestTimeoutError         408  the request's body did not arrive in time
        ├── ConflictError               409  (resource?) state forbids the change
        ├── SessionBusyError            409  (sessionID)
        ├── InstructionEntryValueTooLargeError  413  (actualBytes, maxBytes)
        ├── InstructionEntriesFullError  413  (maxEntries, maxBytes) a session's entries in all
        ├── PayloadTooLargeError        413  (maxBytes) a request body over the limit
        ├── UnsupportedMediaTypeError   415  a request body that is not application/json
        ├── MisdirectedRequestError     421  a Host header that does not name this server
        ├── UnknownError                500  (ref?) a bug; never the caller's fault
        └── ServiceUnavailableError     503  (service?) we are closing or not ready
            └── StorageUnavailableError 503  the database failed (disk full, I/O); retryable

Infrastructure failures (storage broken, transport lost) have their own
hierarchies in their packages and are translated once at each boundary.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "ConflictError",
    "DomainError",
    "ForbiddenError",
    "InstructionEntriesFullError",
    "InstructionEntryValueTooLargeError",
    "InvalidCursorError",
    "InvalidRequestError",
    "MessageNotFoundError",
    "MethodNotAllowedError",
    "MisdirectedRequestError",
    "PayloadTooLargeError",
    "RequestTimeoutError",
    "RouteNotFoundError",
    "ServiceUnavailableError",
    "SessionBusyError",
    "SessionNotFoundError",
    "SessionRtError",
    "StorageUnavailableError",
    "UnauthorizedError",
    "UnknownError",
    "UnsupportedMediaTypeError",
    "error_types",
    "from_wire",
]


class SessionRtError(Exception):
    """Base class of every exception sessionrt raises on purpose."""


class DomainError(SessionRtError):
    """An error with a public wire tag and HTTP status.

    ``fields`` holds the tag's extra members under their wire names; only
    those that are set are sent.
    """

    tag: ClassVar[str] = "UnknownError"
    status: ClassVar[int] = 500
    #: Wire names of the extra fields this tag may carry.
    field_names: ClassVar[tuple[str, ...]] = ()

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        unknown = set(fields) - set(self.field_names)
        if unknown:
            raise TypeError(f"{self.tag} has no fields {sorted(unknown)}")
        self.fields: dict[str, Any] = {k: v for k, v in fields.items() if v is not None}

    def to_wire(self) -> dict[str, Any]:
        return {"_tag": self.tag, "message": self.message, **self.fields}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DomainError) and (
            type(other) is type(self) and other.to_wire() == self.to_wire()
        )

    def __hash__(self) -> int:
        return hash((self.tag, self.message))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.to_wire()!r})"


class InvalidRequestError(DomainError):
    tag = "InvalidRequestError"
    status = 400
    field_names = ("kind", "field")

    def __init__(self, message: str, *, kind: str | None = None, field: str | None = None):
        super().__init__(message, kind=kind, field=field)


class InvalidCursorError(DomainError):
    tag = "InvalidCursorError"
    status = 400

    def __init__(self, message: str = "Invalid cursor") -> None:
        super().__init__(message)


class UnauthorizedError(DomainError):
    tag = "UnauthorizedError"
    status = 401

    def __init__(self, message: str = "Unauthorized") -> None:
        super().__init__(message)


class ForbiddenError(DomainError):
    tag = "ForbiddenError"
    status = 403


class SessionNotFoundError(DomainError):
    tag = "SessionNotFoundError"
    status = 404
    field_names = ("sessionID",)

    def __init__(self, session_id: str, message: str | None = None) -> None:
        super().__init__(message or f"Session not found: {session_id}", sessionID=session_id)

    @property
    def session_id(self) -> str:
        return str(self.fields["sessionID"])


class MessageNotFoundError(DomainError):
    tag = "MessageNotFoundError"
    status = 404
    field_names = ("sessionID", "messageID")

    def __init__(self, session_id: str, message_id: str, message: str | None = None) -> None:
        super().__init__(
            message or f"Message not found: {message_id}",
            sessionID=session_id,
            messageID=message_id,
        )


class PermissionNotFoundError(DomainError):
    tag = "PermissionNotFoundError"
    status = 404
    field_names = ("sessionID", "permissionID")

    def __init__(self, session_id: str, permission_id: str, message: str | None = None) -> None:
        super().__init__(
            message or f"Permission request not found: {permission_id}",
            sessionID=session_id,
            permissionID=permission_id,
        )


class RouteNotFoundError(DomainError):
    tag = "RouteNotFoundError"
    status = 404


class MethodNotAllowedError(DomainError):
    tag = "MethodNotAllowedError"
    status = 405


class RequestTimeoutError(DomainError):
    tag = "RequestTimeoutError"
    status = 408


class ConflictError(DomainError):
    tag = "ConflictError"
    status = 409
    field_names = ("resource",)

    def __init__(self, message: str, *, resource: str | None = None) -> None:
        super().__init__(message, resource=resource)


class SessionBusyError(DomainError):
    tag = "SessionBusyError"
    status = 409
    field_names = ("sessionID",)

    def __init__(self, session_id: str, message: str | None = None) -> None:
        super().__init__(message or f"Session is busy: {session_id}", sessionID=session_id)


class InstructionEntryValueTooLargeError(DomainError):
    tag = "InstructionEntryValueTooLargeError"
    status = 413
    field_names = ("actualBytes", "maxBytes")

    def __init__(self, actual_bytes: int, max_bytes: int, message: str | None = None) -> None:
        super().__init__(
            message or f"Instruction entry value is {actual_bytes} bytes; the limit is {max_bytes}",
            actualBytes=actual_bytes,
            maxBytes=max_bytes,
        )


class InstructionEntriesFullError(DomainError):
    tag = "InstructionEntriesFullError"
    status = 413
    field_names = ("maxEntries", "maxBytes")

    def __init__(self, max_entries: int, max_bytes: int, message: str | None = None) -> None:
        super().__init__(
            message
            or f"A session holds at most {max_entries} instruction entries of {max_bytes}"
            " bytes in all",
            maxEntries=max_entries,
            maxBytes=max_bytes,
        )


class PayloadTooLargeError(DomainError):
    tag = "PayloadTooLargeError"
    status = 413
    field_names = ("maxBytes",)

    def __init__(self, max_bytes: int, message: str | None = None) -> None:
        super().__init__(
            message or f"Request body is larger than {max_bytes} bytes", maxBytes=max_bytes
        )


class UnsupportedMediaTypeError(DomainError):
    tag = "UnsupportedMediaTypeError"
    status = 415


class MisdirectedRequestError(DomainError):
    tag = "MisdirectedRequestError"
    status = 421


class UnknownError(DomainError):
    tag = "UnknownError"
    status = 500
    field_names = ("ref",)

    def __init__(self, message: str = "Internal error", *, ref: str | None = None) -> None:
        super().__init__(message, ref=ref)


class ServiceUnavailableError(DomainError):
    tag = "ServiceUnavailableError"
    status = 503
    field_names = ("service",)

    def __init__(self, message: str = "Service unavailable", *, service: str | None = None):
        super().__init__(message, service=service)


class StorageUnavailableError(ServiceUnavailableError):
    """The database cannot take the request now (disk full, I/O error); nothing of it was
    stored, and the same request may succeed later."""

    tag = "StorageUnavailableError"

    def __init__(self, message: str = "Storage unavailable", *, service: str | None = "storage"):
        super().__init__(message, service=service)


def error_types() -> dict[str, type[DomainError]]:
    """The registry of wire tags to classes."""
    return {cls.tag: cls for cls in _ALL}


_ALL: tuple[type[DomainError], ...] = (
    InvalidRequestError,
    InvalidCursorError,
    UnauthorizedError,
    ForbiddenError,
    SessionNotFoundError,
    MessageNotFoundError,
    PermissionNotFoundError,
    RouteNotFoundError,
    MethodNotAllowedError,
    RequestTimeoutError,
    ConflictError,
    SessionBusyError,
    InstructionEntryValueTooLargeError,
    InstructionEntriesFullError,
    PayloadTooLargeError,
    UnsupportedMediaTypeError,
    MisdirectedRequestError,
    UnknownError,
    ServiceUnavailableError,
    StorageUnavailableError,
)


def from_wire(body: dict[str, Any]) -> DomainError | None:
    """Rebuild a tagged error from its wire body; None when the tag is not ours."""
    cls = error_types().get(str(body.get("_tag")))
    if cls is None:
        return None
    err = DomainError.__new__(cls)
    message = str(body.get("message", ""))
    DomainError.__init__(
        err,
        message,
        **{k: body[k] for k in cls.field_names if body.get(k) is not None},
    )
    return err
