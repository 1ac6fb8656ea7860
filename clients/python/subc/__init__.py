"""A typed Python client of subc, the packet-subscription compiler service.

    import subc
    from subc.v1 import subc_pb2 as pb

    with subc.Client("127.0.0.1:50051", token="...") as c:
        try:
            c.add(["stock == GOOGL && price > 100 : fwd(3)"])
        except subc.SubscriptionRefused as e:
            for d in e.diagnostics:
                print(d.rendered)

`Client` wraps the generated stubs of `subc.v1` (`subc.v1.subc_pb2`,
`subc.v1.subc_pb2_grpc`), generated from proto/subc/v1/subc.proto.
"""

from subc._client import DEFAULT_TIMEOUT, Client, TargetKind, Watch
from subc._errors import Diagnostic, Severity, SubcError, SubscriptionRefused, error_from_rpc

__all__ = [
    "DEFAULT_TIMEOUT",
    "Client",
    "Diagnostic",
    "Severity",
    "SubcError",
    "SubscriptionRefused",
    "TargetKind",
    "Watch",
    "error_from_rpc",
]
__version__ = "0.1.0"
