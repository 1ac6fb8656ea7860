"""Where the live server is: `crates/server/tests/python_client.rs` starts
`subc serve` in-process on loopback (a plaintext server and an mTLS one) and
runs this suite with the options below. Without them the live tests skip.

    pytest clients/python/tests --subc-target 127.0.0.1:PORT --subc-token APP_TOKEN \\
        --subc-admin-token ADMIN_TOKEN [--subc-tls-target 127.0.0.1:PORT --subc-certs DIR]
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Iterator, Optional

import pytest

import subc


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("subc", "the live subc server")
    group.addoption("--subc-target", help="host:port of a plaintext subc serve")
    group.addoption("--subc-token", help="an application's token")
    group.addoption("--subc-admin-token", help="the administrator's token")
    group.addoption("--subc-tls-target", help="host:port of a subc serve with mTLS")
    group.addoption("--subc-certs", help="the directory of ca.pem, client.pem and client.key of the mTLS server")


@dataclasses.dataclass(frozen=True)
class Server:
    """The live servers' addresses, the tokens, and the mTLS certificates."""

    target: str
    token: str
    admin_token: str
    tls_target: Optional[str]
    certs: Optional[Path]


@pytest.fixture(scope="session")
def server(request: pytest.FixtureRequest) -> Server:
    opt = request.config.getoption
    if not (opt("--subc-target") and opt("--subc-token") and opt("--subc-admin-token")):
        pytest.skip("no live server (--subc-target, --subc-token, --subc-admin-token)")
    certs = opt("--subc-certs")
    return Server(opt("--subc-target"), opt("--subc-token"), opt("--subc-admin-token"), opt("--subc-tls-target"), Path(certs) if certs else None)


@pytest.fixture
def client(server: Server) -> Iterator[subc.Client]:
    """A client with the application's token."""
    with subc.Client(server.target, token=server.token, timeout=60) as c:
        yield c


@pytest.fixture
def admin(server: Server) -> Iterator[subc.Client]:
    """A client with the administrator's token."""
    with subc.Client(server.target, token=server.admin_token, timeout=60) as c:
        yield c
