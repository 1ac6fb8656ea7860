"""Errors of the subc client, and refused subscription text as diagnostics.

A refusal of subscription text (INVALID_ARGUMENT, or RESOURCE_EXHAUSTED for
a limit) carries a standard `google.rpc.Status` in `grpc-status-details-bin`;
its details hold one `subc.v1.Diagnostics` (the first diagnostics and the
total) and one `google.rpc.ErrorInfo` (the first code as `reason`, domain
`subc`). grpcio-status's `rpc_status.from_call` decodes it.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Optional

import grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from subc.v1 import subc_pb2

__all__ = ["Diagnostic", "Severity", "SubcError", "SubscriptionRefused", "error_from_rpc"]


class Severity(enum.IntEnum):
    """How bad a diagnostic is (`subc.v1.Severity`)."""

    UNSPECIFIED = 0
    #: The text is refused.
    ERROR = 1
    #: Accepted, but probably not what was meant (e.g. W0301).
    WARNING = 2

    @classmethod
    def _missing_(cls, value: object) -> "Severity":
        # A newer server's severity this client does not know yet.
        return cls.UNSPECIFIED


@dataclasses.dataclass(frozen=True)
class Diagnostic:
    """One diagnostic, as `subc check --json` prints it.

    Lines and columns are 1-based (columns in characters); `rendered` is the
    rustc-style text `subc check` prints, code, location and caret included.
    """

    severity: Severity
    code: str
    message: str
    file: str
    line: int
    column: int
    end_line: int
    end_column: int
    snippet: str
    label: str
    help: str
    rendered: str

    @classmethod
    def from_proto(cls, d: subc_pb2.Diagnostic) -> "Diagnostic":
        """The diagnostic of a `subc.v1.Diagnostic` message (in a refusal,
        a `CheckResponse` or an `AddResponse`'s warnings)."""
        return cls(
            severity=Severity(d.severity),
            code=d.code,
            message=d.message,
            file=d.file,
            line=d.line,
            column=d.column,
            end_line=d.end_line,
            end_column=d.end_column,
            snippet=d.snippet,
            label=d.label,
            help=d.help,
            rendered=d.rendered,
        )

    def __str__(self) -> str:
        return self.rendered or f"{self.code}: {self.message} at {self.file}:{self.line}:{self.column}"


class SubcError(Exception):
    """A call to the subc service failed.

    `code` is the gRPC status code (`grpc.StatusCode.NOT_FOUND`, ...),
    `message` the status message. The `grpc.RpcError` it came from is the
    exception's `__cause__`.
    """

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


class SubscriptionRefused(SubcError):
    """The service refused subscription text: `diagnostics` are the first
    diagnostics (as many as fit in the reply's metadata), `total` how many
    the text had in all (`Client.check` returns every one), `reason` the
    first code (the `google.rpc.ErrorInfo` reason)."""

    def __init__(self, code: grpc.StatusCode, message: str, diagnostics: list[Diagnostic], total: int, reason: str) -> None:
        super().__init__(code, message)
        self.diagnostics = diagnostics
        self.total = total
        self.reason = reason


def error_from_rpc(e: grpc.RpcError) -> SubcError:
    """The client's error for a failed call: `SubscriptionRefused` when the
    status details hold `subc.v1.Diagnostics`, else `SubcError`."""
    code: grpc.StatusCode = e.code()
    message: str = e.details() or ""
    status = _status_of(e)
    if status is None:
        return SubcError(code, message)
    diagnostics: Optional[subc_pb2.Diagnostics] = None
    reason = ""
    for detail in status.details:
        if detail.Is(subc_pb2.Diagnostics.DESCRIPTOR):
            diagnostics = subc_pb2.Diagnostics()
            detail.Unpack(diagnostics)
        elif detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            reason = info.reason
    if diagnostics is None:
        return SubcError(code, message)
    return SubscriptionRefused(code, message, [Diagnostic.from_proto(d) for d in diagnostics.diagnostics], diagnostics.total, reason)


def _status_of(e: grpc.RpcError) -> Optional[status_pb2.Status]:
    """The `google.rpc.Status` of a failed call, or None (no details, or
    details whose code or message disagree with the call's)."""
    if not isinstance(e, grpc.Call):
        return None
    try:
        return rpc_status.from_call(e)
    except ValueError:
        return None
