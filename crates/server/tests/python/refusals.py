"""An independent client's view of subc's refusals: Python grpcio, with stubs
generated from proto/subc.proto by grpcio-tools at run time.

Usage: refusals.py PROTO_DIR HOST:PORT TOKEN

Every refusal must arrive as the status the server sent (not grpcio's
RESOURCE_EXHAUSTED "Stream removed", which is what a client sees when reply
metadata passes its limit: 8 KiB soft, 16 KiB hard), with a
google.rpc.Status in `grpc-status-details-bin` whose details decode as
subc.v1.Diagnostics. Prints one JSON line per case.
"""

import json
import os
import sys
import tempfile

import grpc
from grpc_tools import protoc
from google.rpc import status_pb2


def stubs(proto_dir):
    out = tempfile.mkdtemp(prefix="subc-py-")
    args = ["protoc", f"-I{proto_dir}", f"--python_out={out}", f"--grpc_python_out={out}", os.path.join(proto_dir, "subc.proto")]
    if protoc.main(args) != 0:
        raise SystemExit("grpc_tools.protoc failed")
    sys.path.insert(0, out)
    import subc_pb2
    import subc_pb2_grpc

    return subc_pb2, subc_pb2_grpc


def main():
    proto_dir, addr, token = sys.argv[1:4]
    pb, rpc = stubs(proto_dir)
    channel = grpc.insecure_channel(addr)
    subs = rpc.SubscriptionsStub(channel)
    meta = [("authorization", f"Bearer {token}")]
    long_name = "x" * 4000
    cases = {
        "100 invalid lines": [f"nosuchfield{i} == 1 : fwd(1)" for i in range(100)],
        "200 lines of 4 KB": [f"add_order.{long_name} == 1 : fwd(1)" for _ in range(200)],
        "an E0320": [" && ".join(f"(price != {i} || shares != {i})" for i in range(13)) + " : fwd(1)"],
    }
    failures = 0
    for name, lines in cases.items():
        try:
            subs.Add(pb.AddRequest(lines=lines), metadata=meta, timeout=60)
            print(json.dumps({"case": name, "error": "accepted"}))
            failures += 1
            continue
        except grpc.RpcError as e:
            code = e.code().name
            trailers = dict(e.trailing_metadata() or ())
            raw = trailers.get("grpc-status-details-bin")
            result = {"case": name, "code": code, "message": e.details()[:200]}
            if raw is None:
                result["error"] = "no grpc-status-details-bin"
                failures += 1
            else:
                st = status_pb2.Status.FromString(raw)
                diags = pb.Diagnostics()
                any_ok = [d for d in st.details if d.type_url == "type.googleapis.com/subc.v1.Diagnostics"]
                if not any_ok:
                    result["error"] = "no subc.v1.Diagnostics in the details"
                    failures += 1
                else:
                    diags.ParseFromString(any_ok[0].value)
                    result.update(status_code=st.code, shown=len(diags.diagnostics), total=diags.total,
                                  first_code=diags.diagnostics[0].code if diags.diagnostics else None,
                                  metadata_bytes=sum(len(k) + len(v) for k, v in trailers.items()) + len(e.details().encode()))
            if code not in ("INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"):
                result["error"] = f"code {code}"
                failures += 1
            print(json.dumps(result))
        full = subs.Check(pb.AddRequest(lines=lines), metadata=meta, timeout=60)
        print(json.dumps({"case": name, "check_ok": full.ok, "check_total": full.total, "check_diagnostics": len(full.diagnostics)}))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
