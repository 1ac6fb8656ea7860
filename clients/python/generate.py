#!/usr/bin/env python3
"""Generates the Python stubs of the subc API from proto/subc/v1/subc.proto.

    python generate.py            # (re)writes subc/v1/subc_pb2.py, .pyi and subc_pb2_grpc.py
    python generate.py --check    # exit 1 when the committed stubs differ from a fresh generation

Needs grpcio-tools, at the version requirements-dev.txt pins: the generated
text depends on it. The stubs are committed so that `pip install` needs no
code generation; scripts/test.sh runs `--check` so the proto and the stubs
cannot drift apart.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent.parent / "proto"
PROTO = "subc/v1/subc.proto"
OUTPUTS = ("subc/v1/subc_pb2.py", "subc/v1/subc_pb2.pyi", "subc/v1/subc_pb2_grpc.py")


def generate(out: Path) -> None:
    """Writes the stubs under `out` (as `out/subc/v1/...`)."""
    from grpc_tools import protoc

    # The well-known types (Timestamp, Struct) come with grpcio-tools.
    well_known = Path(protoc.__file__).resolve().parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        str(PROTO_ROOT / PROTO),
    ]
    if protoc.main(args) != 0:
        raise SystemExit(f"grpc_tools.protoc failed on {PROTO_ROOT / PROTO}")


def stale() -> list[str]:
    """The committed stubs that differ from a fresh generation, each with a diff."""
    with tempfile.TemporaryDirectory(prefix="subc-stubs-") as tmp:
        generate(Path(tmp))
        problems = []
        for name in OUTPUTS:
            fresh = (Path(tmp) / name).read_text()
            committed_path = HERE / name
            committed = committed_path.read_text() if committed_path.exists() else ""
            if fresh != committed:
                diff = difflib.unified_diff(
                    committed.splitlines(keepends=True), fresh.splitlines(keepends=True), f"committed/{name}", f"fresh/{name}", n=1
                )
                problems.append(f"{name} is stale:\n{''.join(list(diff)[:40])}")
        return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    if parser.parse_args().check:
        problems = stale()
        for p in problems:
            print(p, file=sys.stderr)
        if problems:
            print("run: python clients/python/generate.py", file=sys.stderr)
        return 1 if problems else 0
    generate(HERE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
