"""The client against a live `subc serve` (the ITCH example's spec): adds,
refusals as diagnostics, lists, watches, removes, targets, TLS, and every
refusal's details within the 8 KiB that grpcio allows reply metadata."""

from __future__ import annotations

import dataclasses
import uuid

import grpc
import pytest

import subc
from conftest import Server
from subc.v1 import subc_pb2 as pb


def test_add_list_watch_remove(client: subc.Client) -> None:
    first = client.add(["stock == GOOGL && price > 100 : fwd(1)", "", "# a comment", "stock == MSFT : fwd(2)"])
    assert list(first.lines) == [1, 4]
    first_ids = [s.id for s in first.subscriptions]
    assert [s.text for s in first.subscriptions] == ["stock == GOOGL && price > 100 : fwd(1)", "stock == MSFT : fwd(2)"]
    assert all(s.create_time.seconds > 0 for s in first.subscriptions)

    with client.watch(replay=True, timeout=60) as events:
        # Stored events first, then live ones: this add is seen either way.
        second = client.add("stock == AAPL : fwd(3)\n")
        second_id = second.subscriptions[0].id
        added = []
        for e in events:
            if e.kind == pb.EVENT_KIND_SUBSCRIPTIONS_ADDED and set(e.subscription_ids) & {*first_ids, second_id}:
                added.append(list(e.subscription_ids))
            if second_id in sum(added, []):
                break
        assert added == [first_ids, [second_id]]

        listed = {s.id: s for s in client.list(page_size=2)}
        for id in [*first_ids, second_id]:
            assert id in listed and listed[id].app
        assert client.get(second_id).text == "stock == AAPL : fwd(3)"

        removed = client.remove([*first_ids, second_id])
        assert removed.generation > second.generation
        for e in events:
            if e.kind == pb.EVENT_KIND_SUBSCRIPTIONS_REMOVED:
                assert sorted(e.subscription_ids) == sorted([*first_ids, second_id])
                break
    assert not {*first_ids, second_id} & {s.id for s in client.list()}


def test_refused_line_has_diagnostics(client: subc.Client) -> None:
    before = [s.id for s in client.list()]
    with pytest.raises(subc.SubscriptionRefused) as refused:
        client.add(["stock == GOOGL : fwd(1)", "stok == GOOGL : fwd(2)"], source_name="mine.subs")
    e = refused.value
    assert isinstance(e, subc.SubcError)
    assert e.code == grpc.StatusCode.INVALID_ARGUMENT
    assert e.total == 1 and e.reason == "E0302"
    [d] = e.diagnostics
    assert isinstance(d, subc.Diagnostic)
    assert (d.severity, d.code, d.file, d.line, d.column, d.snippet) == (subc.Severity.ERROR, "E0302", "mine.subs", 2, 1, "stok")
    assert (d.end_line, d.end_column) == (2, 5)
    assert "E0302" in d.rendered and "mine.subs:2:1" in d.rendered
    assert "E0302" in e.message
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.line = 3  # type: ignore[misc]
    # Atomic: the valid first line was not added either.
    assert [s.id for s in client.list()] == before


def test_check_returns_every_diagnostic(client: subc.Client) -> None:
    r = client.check([f"nosuchfield{i} == 1 : fwd(1)" for i in range(3)])
    assert not r.ok and r.total == 3
    diagnostics = [subc.Diagnostic.from_proto(d) for d in r.diagnostics]
    assert [(d.code, d.line) for d in diagnostics] == [("E0302", 1), ("E0302", 2), ("E0302", 3)]
    assert client.check(["stock == GOOGL : fwd(1)"]).ok


# Each case's refusal must arrive as the status the server sent, not as
# grpcio's RESOURCE_EXHAUSTED "Stream removed" (what a client sees when reply
# metadata passes its limit: 8 KiB soft, 16 KiB hard).
REFUSALS = {
    "100 invalid lines": ([f"nosuchfield{i} == 1 : fwd(1)" for i in range(100)], grpc.StatusCode.INVALID_ARGUMENT, "E0302", 100),
    "200 lines of 4 KB": (
        [f"add_order.{'x' * 4000} == 1 : fwd(1)" for _ in range(200)],
        grpc.StatusCode.INVALID_ARGUMENT,
        "E0302",
        200,
    ),
    "an E0320": (
        [" && ".join(f"(price != {i} || shares != {i})" for i in range(13)) + " : fwd(1)"],
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "E0320",
        1,
    ),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_refusals_fit_the_metadata_budget(client: subc.Client, case: str) -> None:
    lines, code, first, total = REFUSALS[case]
    with pytest.raises(subc.SubscriptionRefused) as refused:
        client.add(lines)
    e = refused.value
    assert (e.code, e.diagnostics[0].code, e.total, e.reason) == (code, first, total, first)
    assert 0 < len(e.diagnostics) <= total
    call = e.__cause__
    assert isinstance(call, grpc.Call)
    metadata_bytes = sum(len(k) + len(v) for k, v in call.trailing_metadata() or ()) + len(e.message.encode())
    assert metadata_bytes < 8192, metadata_bytes
    full = client.check(lines)
    assert (full.ok, full.total) == (False, total)


def test_other_errors_are_subc_errors(server: Server, client: subc.Client) -> None:
    with pytest.raises(subc.SubcError) as missing:
        client.get(2**60)
    assert missing.value.code == grpc.StatusCode.NOT_FOUND
    assert not isinstance(missing.value, subc.SubscriptionRefused)
    with subc.Client(server.target, token="not-a-token") as stranger:
        with pytest.raises(subc.SubcError) as denied:
            list(stranger.list())
    assert denied.value.code == grpc.StatusCode.UNAUTHENTICATED
    # Targets belong to the administrator.
    with pytest.raises(subc.SubcError) as forbidden:
        client.list_targets()
    assert forbidden.value.code == grpc.StatusCode.PERMISSION_DENIED


def test_request_id_makes_a_retry_safe(client: subc.Client) -> None:
    key = str(uuid.uuid4())
    first = client.add(["stock == IBM : fwd(4)"], request_id=key)
    again = client.add(["stock == IBM : fwd(4)"], request_id=key)
    assert again.replayed and [s.id for s in again.subscriptions] == [s.id for s in first.subscriptions]
    client.remove(first.subscriptions[0].id)


def test_targets(admin: subc.Client, client: subc.Client) -> None:
    added = client.add(["stock == NVDA : fwd(5)"])
    name = f"py-{uuid.uuid4().hex[:8]}"
    target = admin.register(name, pb.SimTarget())
    assert target.name == name and target.HasField("sim")
    assert name in [t.name for t in admin.list_targets()]
    plan = admin.plan(name)
    assert plan.full_install and plan.inserts > 0 and len(plan.ops) > 0
    status = admin.deploy(name, timeout=30)
    assert status.state == pb.TARGET_STATE_IN_SYNC and status.deployed_generation >= added.generation
    assert status.last_deploy_time.seconds > 0
    assert admin.status(name).entries == status.entries > 0
    with pytest.raises(TypeError):
        admin.register("x", pb.Subscription())  # type: ignore[arg-type]
    admin.remove_target(name)
    assert name not in [t.name for t in admin.list_targets()]
    client.remove(s.id for s in added.subscriptions)


def test_mutual_tls(server: Server) -> None:
    certs = server.certs
    if server.tls_target is None or certs is None:
        pytest.skip("no mTLS server (--subc-tls-target, --subc-certs)")

    def pem(name: str) -> bytes:
        return (certs / name).read_bytes()

    with subc.Client(
        server.tls_target,
        token=server.token,
        root_certs=pem("ca.pem"),
        client_cert=pem("client.pem"),
        client_key=pem("client.key"),
        server_name="localhost",
        timeout=30,
    ) as c:
        added = c.add(["stock == TSLA : fwd(6)"])
        assert added.subscriptions[0].id in [s.id for s in c.list()]
    # Without a client certificate the handshake fails.
    with subc.Client(server.tls_target, token=server.token, root_certs=pem("ca.pem"), server_name="localhost", timeout=30) as c:
        with pytest.raises(subc.SubcError) as refused:
            list(c.list())
    assert refused.value.code == grpc.StatusCode.UNAVAILABLE
