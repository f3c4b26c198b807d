"""Errors raised by the client: one exception type per gRPC status code,
each carrying the stable ``reason`` and metadata from ``google.rpc.ErrorInfo``
and the field violations from ``google.rpc.BadRequest``."""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2, status_pb2

_DETAILS_KEY = "grpc-status-details-bin"


class EngramError(Exception):
    """A call to Engram failed.

    ``code`` is the gRPC status code, ``reason`` the stable machine-readable
    reason (``VERSION_MISMATCH``, ``KEY_NOT_FOUND``, ...), ``metadata`` the
    ErrorInfo metadata (e.g. ``current_version``), ``fields`` the invalid
    request fields with their descriptions, and ``retry_delay`` how long
    the server asks a retry to wait (``google.rpc.RetryInfo``, in seconds),
    if it said.
    """

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        reason: str = "",
        metadata: dict[str, str] | None = None,
        fields: dict[str, str] | None = None,
        retry_delay: float | None = None,
    ) -> None:
        super().__init__(f"{code.name}: {message}" + (f" ({reason})" if reason else ""))
        self.code = code
        self.message = message
        self.reason = reason
        self.metadata = metadata or {}
        self.fields = fields or {}
        self.retry_delay = retry_delay


class InvalidArgument(EngramError):
    """A request field is malformed; see ``fields``."""


class NotFound(EngramError):
    """The thing asked for does not exist."""


class AlreadyExists(EngramError):
    """An id is taken."""


class Conflict(EngramError):
    """A compare-and-set lost or a source changed (ABORTED); re-read and retry."""


class FailedPrecondition(EngramError):
    """The call is not allowed in the current state (e.g. another owner's session)."""


class ResourceExhausted(EngramError):
    """A limit was reached, or a stream's consumer was too slow."""


class Unavailable(EngramError):
    """The server or its database is unreachable, or shutting down; retry."""


class Unauthenticated(EngramError):
    """No bearer token, or one the server does not know (TOKEN_MISSING, TOKEN_INVALID)."""


class PermissionDenied(EngramError):
    """The token lacks the role the call needs (ADMIN_REQUIRED)."""


_BY_CODE: dict[grpc.StatusCode, type[EngramError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.ABORTED: Conflict,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
}


#: What a reason means in this client's own terms, where the server's
#: message can only name the request's fields.
_HINTS: dict[str, str] = {
    "SCOPE_NOT_CONFIGURED": (
        "in this client, call memory.configure(scope) first, "
        "or give the client a flow_name (Engram(..., flow_name=...) or set_context)"
    ),
}


def from_rpc_error(error: grpc.RpcError) -> EngramError:
    """Turns a failed call (blocking or asyncio) into an EngramError with
    its details decoded."""
    code, message = grpc.StatusCode.UNKNOWN, str(error)
    trailers: tuple[tuple[str, str | bytes], ...] = ()
    if isinstance(error, grpc.aio.AioRpcError):
        code, message = error.code(), error.details() or message
        trailers = tuple(error.trailing_metadata() or ())
    elif isinstance(error, grpc.Call):
        code, message = error.code(), error.details() or message
        trailers = tuple(error.trailing_metadata() or ())
    reason, metadata, fields = "", {}, {}
    retry_delay: float | None = None
    for key, value in trailers:
        if key != _DETAILS_KEY or not isinstance(value, bytes):
            continue
        status = status_pb2.Status.FromString(value)
        for detail in status.details:
            info = error_details_pb2.ErrorInfo()
            bad = error_details_pb2.BadRequest()
            retry = error_details_pb2.RetryInfo()
            if detail.Unpack(info):
                reason = info.reason
                metadata = dict(info.metadata)
            elif detail.Unpack(bad):
                fields = {v.field: v.description for v in bad.field_violations}
            elif detail.Unpack(retry):
                retry_delay = retry.retry_delay.ToTimedelta().total_seconds()
    if reason in _HINTS:
        message = f"{message}; {_HINTS[reason]}"
    return _BY_CODE.get(code, EngramError)(code, message, reason, metadata, fields, retry_delay)


def _absent(error: NotFound) -> bool:
    """Whether a NOT_FOUND means "no value" rather than "purged since"."""
    return error.reason != "VERSION_PURGED"


def _no_retention(error: NotFound) -> bool:
    """Whether a NOT_FOUND means the scope has no retention policy."""
    return error.reason == "RETENTION_NOT_FOUND"
