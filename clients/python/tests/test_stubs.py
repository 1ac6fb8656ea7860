"""The package as built: stubs that equal a fresh generation from the proto,
dependency floors that match what generated them, and (when installed) the
same files as this tree. Needs no server."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

import subc

HERE = Path(__file__).resolve().parent.parent


def _generate_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("subc_generate", HERE / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_stubs_equal_a_fresh_generation() -> None:
    pytest.importorskip("grpc_tools")
    problems = _generate_module().stale()
    assert not problems, "\n".join(problems) + "\nrun: python clients/python/generate.py"


def test_dependency_floors_are_the_generators() -> None:
    v1 = HERE / "subc" / "v1"
    grpc_version = re.search(r"GRPC_GENERATED_VERSION = '([^']+)'", (v1 / "subc_pb2_grpc.py").read_text())
    protobuf_version = re.search(r"# Protobuf Python Version: (\S+)", (v1 / "subc_pb2.py").read_text())
    assert grpc_version and protobuf_version
    pyproject = (HERE / "pyproject.toml").read_text()
    assert f'"grpcio>={grpc_version[1]}"' in pyproject
    assert re.search(rf'"protobuf>={re.escape(protobuf_version[1])},<\d+"', pyproject)


def test_the_imported_package_is_this_tree() -> None:
    # The live tests run against the installed package (what users get);
    # a stale install would test old code.
    installed = Path(subc.__file__).resolve().parent
    for source in sorted((HERE / "subc").rglob("*.py*")):
        if "__pycache__" in source.parts:
            continue
        copy = installed / source.relative_to(HERE / "subc")
        assert copy.exists() and copy.read_bytes() == source.read_bytes(), (
            f"{copy} differs from {source}: reinstall with "
            f"{sys.executable} -m pip install --no-deps --force-reinstall {HERE}"
        )


def test_register_takes_every_kind_of_target_and_names_them_when_refusing() -> None:
    from subc import Client
    from subc._client import _KIND_FIELDS
    from subc.v1 import subc_pb2

    request_fields = {f.name for f in subc_pb2.RegisterTargetRequest.DESCRIPTOR.oneofs_by_name["kind"].fields}
    assert set(_KIND_FIELDS.values()) == request_fields
    c = Client("127.0.0.1:1")
    try:
        c.register("t", subc_pb2.Subscription())  # type: ignore[arg-type]
    except TypeError as e:
        assert "AgentTarget" in str(e) and "CustomTarget" in str(e)
    else:
        raise AssertionError("a Subscription is not a target")
    finally:
        c.close()
