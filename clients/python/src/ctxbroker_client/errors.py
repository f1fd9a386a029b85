"""Exceptions for the daemon's errors.

Every error the daemon returns carries a gRPC status code and, in the
``grpc-status-details-bin`` trailer, google.rpc details: an ``ErrorInfo``
with a stable ``reason`` and metadata (sizes, ids, sequences), and for bad
input a ``BadRequest`` naming each offending field. :func:`from_rpc_error`
decodes them into one exception class per code, refined by reason where a
caller acts on it (``except CompactionInvariant`` vs ``except
FailedPrecondition``), so no caller ever parses a message.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import grpc
import grpc.aio
from google.rpc import error_details_pb2, status_pb2

#: The ErrorInfo domain of every error the daemon returns.
ERROR_DOMAIN = "ctxbroker.v1"


@dataclass(frozen=True)
class FieldViolation:
    """One bad field of a request, as the daemon named it."""

    #: The field's path, e.g. ``spans[2].text``.
    field: str
    #: What is wrong and the limit.
    description: str


@dataclass(frozen=True)
class PreconditionViolation:
    """One violated precondition (a compaction invariant, for instance)."""

    #: The violation kind, e.g. ``VIOLATION_KIND_TURN_TOO_LARGE``.
    type: str
    #: What it concerns, e.g. ``session/demo`` or ``span/7``.
    subject: str
    #: A human-readable account, with the sizes.
    description: str


class BrokerError(Exception):
    """An error returned by the daemon (or the transport to it)."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        reason: str = "",
        domain: str = "",
        metadata: Mapping[str, str] | None = None,
        field_violations: tuple[FieldViolation, ...] = (),
        precondition_violations: tuple[PreconditionViolation, ...] = (),
        trailers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(f"{code.name}: {message}" + (f" [{reason}]" if reason else ""))
        #: The gRPC status code.
        self.code = code
        #: The status message.
        self.message = message
        #: ErrorInfo.reason: stable and machine-readable ("" when absent).
        self.reason = reason
        #: ErrorInfo.domain ("ctxbroker.v1" for the daemon's own errors).
        self.domain = domain
        #: ErrorInfo.metadata: the sizes, ids and sequences at stake.
        self.metadata: Mapping[str, str] = dict(metadata or {})
        #: BadRequest field violations.
        self.field_violations = field_violations
        #: PreconditionFailure violations.
        self.precondition_violations = precondition_violations
        #: Plain trailing metadata (e.g. ``resume-from-seq``).
        self.trailers: Mapping[str, str] = dict(trailers or {})

    def metadata_int(self, key: str, trailer: str | None = None) -> int | None:
        """An ErrorInfo metadata value as an integer, else the trailer
        ``trailer`` as one (when given), or None."""
        for value in (self.metadata.get(key), self.trailers.get(trailer) if trailer else None):
            try:
                if value is not None:
                    return int(value)
            except ValueError:
                pass
        return None


class InvalidArgument(BrokerError):
    """INVALID_ARGUMENT: a field is malformed or past a limit; see
    :attr:`field_violations`."""


class NotFound(BrokerError):
    """NOT_FOUND."""


class SessionNotFound(NotFound):
    """The session does not exist (reason SESSION_NOT_FOUND)."""


class SpanNotFound(NotFound):
    """The span does not exist in the session (reason SPAN_NOT_FOUND)."""


class AlreadyExists(BrokerError):
    """ALREADY_EXISTS (reason SESSION_EXISTS for a taken session id)."""


class FailedPrecondition(BrokerError):
    """FAILED_PRECONDITION."""


class CompactionInvariant(FailedPrecondition):
    """A compaction could not be made valid, or a turn can never fit
    (reason COMPACTION_INVARIANT). Nothing changed; watchers saw an ABORTED
    marker whose sequence is :attr:`marker_seq`."""

    @property
    def live_tokens(self) -> int | None:
        """Live tokens when the request was refused."""
        return self.metadata_int("live_tokens")

    @property
    def incoming_tokens(self) -> int | None:
        """Tokens of the refused turn."""
        return self.metadata_int("incoming_tokens")

    @property
    def pinned_tokens(self) -> int | None:
        """Tokens held by pinned constraints."""
        return self.metadata_int("pinned_tokens")

    @property
    def budget_tokens(self) -> int | None:
        """The session's budget."""
        return self.metadata_int("budget_tokens")

    @property
    def window_tokens(self) -> int | None:
        """The session's window."""
        return self.metadata_int("window_tokens")

    @property
    def marker_seq(self) -> int | None:
        """The ABORTED marker that recorded the refusal."""
        return self.metadata_int("marker_seq")

    @property
    def violations(self) -> list[str]:
        """The violation kinds, e.g. ``["VIOLATION_KIND_TURN_TOO_LARGE"]``."""
        names = self.metadata.get("violations", "")
        return [name for name in names.split(",") if name]


class ApprovalRequired(FailedPrecondition):
    """The session needs approval to compact (reason APPROVAL_REQUIRED):
    commit :attr:`plan_id`, then admit the turn again."""

    @property
    def plan_id(self) -> str:
        """A plan ready to commit."""
        return self.metadata.get("plan_id", "")


class Aborted(BrokerError):
    """ABORTED."""


class StalePlan(Aborted):
    """The plan was made against an earlier revision (reason STALE_PLAN):
    plan again."""


class OutOfRange(BrokerError):
    """OUT_OF_RANGE."""


class MarkerOutOfRange(OutOfRange):
    """A watch asked for markers older than retention (reason
    MARKER_OUT_OF_RANGE). Markers below :attr:`oldest_seq` are gone: a
    watcher that needs them cannot continue without a gap."""

    @property
    def oldest_seq(self) -> int | None:
        """The oldest marker still retained."""
        return self.metadata_int("oldest_seq", "oldest-seq")


class ResourceExhausted(BrokerError):
    """RESOURCE_EXHAUSTED: a capacity limit (sessions, streams)."""


class Unavailable(BrokerError):
    """UNAVAILABLE: the daemon is down, restarting or shutting down.
    Retrying is safe for reads and for admissions with idempotency keys."""

    @property
    def resume_from_seq(self) -> int | None:
        """For a watch ended by shutdown: where to resume."""
        return self.metadata_int("resume_from_seq", "resume-from-seq")


class DeadlineExceeded(BrokerError):
    """DEADLINE_EXCEEDED."""


class Unauthenticated(BrokerError):
    """UNAUTHENTICATED."""


class PermissionDenied(BrokerError):
    """PERMISSION_DENIED."""


class Unimplemented(BrokerError):
    """UNIMPLEMENTED: the daemon does not serve this RPC."""


class DataLoss(BrokerError):
    """DATA_LOSS: a stored record failed its checksum."""


class Internal(BrokerError):
    """INTERNAL, UNKNOWN or any code without a class of its own."""


_BY_CODE: dict[grpc.StatusCode, type[BrokerError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.ABORTED: Aborted,
    grpc.StatusCode.OUT_OF_RANGE: OutOfRange,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
    grpc.StatusCode.DATA_LOSS: DataLoss,
}

_BY_REASON: dict[str, type[BrokerError]] = {
    "SESSION_NOT_FOUND": SessionNotFound,
    "SPAN_NOT_FOUND": SpanNotFound,
    "COMPACTION_INVARIANT": CompactionInvariant,
    "APPROVAL_REQUIRED": ApprovalRequired,
    "STALE_PLAN": StalePlan,
    "MARKER_OUT_OF_RANGE": MarkerOutOfRange,
}


@dataclass
class _Details:
    reason: str = ""
    domain: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    fields: list[FieldViolation] = field(default_factory=list)
    preconditions: list[PreconditionViolation] = field(default_factory=list)


def _decode_details(raw: bytes | None) -> _Details:
    details = _Details()
    if not raw:
        return details
    status = status_pb2.Status()
    try:
        status.ParseFromString(raw)
    except Exception:  # a malformed trailer must not hide the status itself
        return details
    for any_detail in status.details:
        info = error_details_pb2.ErrorInfo()
        bad = error_details_pb2.BadRequest()
        failure = error_details_pb2.PreconditionFailure()
        if any_detail.Is(info.DESCRIPTOR) and any_detail.Unpack(info):
            details.reason = info.reason
            details.domain = info.domain
            details.metadata.update(info.metadata)
        elif any_detail.Is(bad.DESCRIPTOR) and any_detail.Unpack(bad):
            details.fields.extend(
                FieldViolation(v.field, v.description) for v in bad.field_violations
            )
        elif any_detail.Is(failure.DESCRIPTOR) and any_detail.Unpack(failure):
            details.preconditions.extend(
                PreconditionViolation(v.type, v.subject, v.description) for v in failure.violations
            )
    return details


def from_rpc_error(err: grpc.RpcError) -> BrokerError:
    """The typed exception for a failed call."""
    # A sync call's error is also its grpc.Call; an asyncio call's error
    # (grpc.aio.AioRpcError) carries the same accessors.
    call = err if isinstance(err, (grpc.Call, grpc.aio.AioRpcError)) else None
    code = (call.code() if call is not None else None) or grpc.StatusCode.UNKNOWN
    message = (call.details() if call is not None else str(err)) or ""
    raw: bytes | None = None
    trailers: dict[str, str] = {}
    if call is not None:
        for key, value in call.trailing_metadata() or ():
            if key == "grpc-status-details-bin":
                raw = value if isinstance(value, bytes) else None
            elif isinstance(value, str):
                trailers[key] = value
    details = _decode_details(raw)
    cls = _BY_REASON.get(details.reason) or _BY_CODE.get(code, Internal)
    # A reason only refines the class its code maps to.
    if not issubclass(cls, _BY_CODE.get(code, Internal)):
        cls = _BY_CODE.get(code, Internal)
    return cls(
        code,
        message,
        reason=details.reason,
        domain=details.domain,
        metadata=details.metadata,
        field_violations=tuple(details.fields),
        precondition_violations=tuple(details.preconditions),
        trailers=trailers,
    )
