#!/usr/bin/env python3
"""Extracts the P4Runtime protocol as a FileDescriptorSet from the official
`p4runtime` package on PyPI, so that Rust can compile it without protoc.

The generated `*_pb2` modules of that package embed each .proto file's
serialized FileDescriptorProto. This script collects the descriptors of
p4/v1/p4runtime.proto and everything it imports (p4info, p4types, p4data,
google/rpc/status from googleapis-common-protos, google/protobuf/any from
protobuf), dependencies first, and writes them as one FileDescriptorSet.

    python3 -m venv /tmp/venv
    /tmp/venv/bin/pip install -r scripts/p4runtime-requirements.txt
    PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python \
        /tmp/venv/bin/python scripts/p4runtime_fds.py proto/p4runtime/p4runtime.fds.bin

With `--check FILE` it compares instead of writing, and fails if the bytes
differ (scripts/test.sh runs it that way).
"""

import hashlib
import sys

from google.protobuf import descriptor_pb2
from p4.v1 import p4runtime_pb2


def collect(fd, out, seen):
    for dep in fd.dependencies:
        collect(dep, out, seen)
    if fd.name not in seen:
        seen.add(fd.name)
        out.append(fd)


def descriptor_set():
    files = []
    collect(p4runtime_pb2.DESCRIPTOR, files, set())
    fds = descriptor_pb2.FileDescriptorSet()
    for fd in files:
        proto = fds.file.add()
        proto.ParseFromString(fd.serialized_pb)
    return fds.SerializeToString(deterministic=True), [fd.name for fd in files]


def main(argv):
    check = len(argv) == 3 and argv[1] == "--check"
    if len(argv) != 2 and not check:
        sys.exit(f"usage: {argv[0]} [--check] OUT.fds.bin")
    path = argv[-1]
    data, names = descriptor_set()
    digest = hashlib.sha256(data).hexdigest()
    if check:
        with open(path, "rb") as f:
            have = f.read()
        if have != data:
            sys.exit(f"{path} differs from the descriptors of the installed p4runtime package "
                     f"(sha256 {hashlib.sha256(have).hexdigest()} vs {digest})")
        print(f"{path}: matches the installed p4runtime package ({len(data)} bytes)")
    else:
        with open(path, "wb") as f:
            f.write(data)
        print(f"wrote {path}: {', '.join(names)} ({len(data)} bytes, sha256 {digest})")


if __name__ == "__main__":
    main(sys.argv)
