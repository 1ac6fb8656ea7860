"""The client: one gRPC channel to `subc serve`, plain or TLS, the bearer
token on every call, and one thin method per RPC over the generated stubs.

Methods return the API's messages (`subc.v1.subc_pb2`) and raise
`SubscriptionRefused` for refused subscription text, `SubcError` for any
other failed call.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Callable, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Type, TypeVar, Union, cast

import grpc
from google.protobuf.message import Message

from subc._errors import error_from_rpc
from subc.v1 import subc_pb2, subc_pb2_grpc

__all__ = ["Client", "Watch", "TargetKind"]

#: What a target is: an eBPF program, a P4Runtime switch, a host running
#: `subc agent`, the simulated target, or a custom kind of the server's.
TargetKind = Union[
    subc_pb2.EbpfTarget, subc_pb2.P4RuntimeTarget, subc_pb2.AgentTarget, subc_pb2.SimTarget, subc_pb2.CustomTarget
]

_KIND_FIELDS = {
    subc_pb2.EbpfTarget: "ebpf",
    subc_pb2.P4RuntimeTarget: "p4runtime",
    subc_pb2.AgentTarget: "agent",
    subc_pb2.SimTarget: "sim",
    subc_pb2.CustomTarget: "custom",
}

#: The deadline of every unary call, in seconds, unless the client is given another.
DEFAULT_TIMEOUT = 60.0

_M = TypeVar("_M", bound=Message)


class Client:
    """A client of the subc compiler service.

    >>> with Client("127.0.0.1:50051", token="...") as c:
    ...     added = c.add(["stock == GOOGL && price > 100 : fwd(3)"])
    ...     print([s.id for s in added.subscriptions])

    `target` is `host:port`, or a URL: `http://host:port` (plaintext) or
    `https://host:port` (TLS). TLS is used with `tls=True`, an `https://`
    target, or any of the PEM arguments: `root_certs` (the CA that signed the
    server's certificate; None: the system's roots), `client_cert` and
    `client_key` (mTLS), and `server_name`, the name the server's
    certificate must carry when it is not the target's host.

    `token` is sent as `authorization: Bearer <token>` on every call: an
    application's token (its own subscriptions) or the administrator's
    (everything, and targets). `timeout` is the deadline of each unary call
    in seconds (None: none); `options` are extra gRPC channel options.
    """

    def __init__(
        self,
        target: str,
        token: Optional[str] = None,
        *,
        tls: Optional[bool] = None,
        root_certs: Optional[bytes] = None,
        client_cert: Optional[bytes] = None,
        client_key: Optional[bytes] = None,
        server_name: Optional[str] = None,
        timeout: Optional[float] = DEFAULT_TIMEOUT,
        options: Sequence[Tuple[str, Any]] = (),
    ) -> None:
        address, scheme_tls = _split_target(target)
        if (client_cert is None) != (client_key is None):
            raise ValueError("client_cert and client_key go together")
        wants_tls = scheme_tls or any(x is not None for x in (root_certs, client_cert, server_name))
        if tls is None:
            tls = wants_tls
        elif not tls and wants_tls:
            raise ValueError("tls=False with an https:// target or TLS settings")
        channel_options = list(options)
        if tls:
            if server_name is not None:
                channel_options.append(("grpc.ssl_target_name_override", server_name))
            credentials = grpc.ssl_channel_credentials(root_certs, client_key, client_cert)
            self._channel = grpc.secure_channel(address, credentials, options=channel_options)
        else:
            self._channel = grpc.insecure_channel(address, options=channel_options)
        self._metadata: Tuple[Tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()
        self._timeout = timeout
        # The generated stubs, for anything the methods below do not cover
        # (pass `metadata=client.metadata`). grpcio-tools writes them untyped.
        self.subscriptions: Any = subc_pb2_grpc.SubscriptionsStub(self._channel)  # type: ignore[no-untyped-call]
        self.targets: Any = subc_pb2_grpc.TargetsStub(self._channel)  # type: ignore[no-untyped-call]
        self.events: Any = subc_pb2_grpc.EventsStub(self._channel)  # type: ignore[no-untyped-call]

    @property
    def metadata(self) -> Tuple[Tuple[str, str], ...]:
        """The metadata every call carries (the token)."""
        return self._metadata

    def close(self) -> None:
        """Closes the channel; calls in flight are cancelled."""
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, kind: Optional[Type[BaseException]], value: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        self.close()

    def _call(self, method: Callable[..., Any], request: Message, reply: Type[_M], timeout: Optional[float] = None) -> _M:
        """Calls a unary method with the token and the deadline; the stubs
        are untyped, so the caller names the `reply` type."""
        try:
            return cast(_M, method(request, metadata=self._metadata, timeout=timeout if timeout is not None else self._timeout))
        except grpc.RpcError as e:
            raise error_from_rpc(e) from e

    # ------------------------------------------------------------ subscriptions

    def add(self, lines: Union[str, Iterable[str]], source_name: Optional[str] = None, request_id: Optional[str] = None) -> subc_pb2.AddResponse:
        """Adds the subscriptions of a rules file's lines, atomically (all or
        none), and returns them with their ids once they are committed.

        `lines` is a list of lines, or one string that is split into lines.
        Blank lines and `#` comments are skipped but counted, so diagnostics
        name the same lines as `subc check` on the file. `source_name` is the
        file name diagnostics show (default `<request>`). With `request_id`,
        a retry of the same lines returns the first reply (`replayed`).

        Raises `SubscriptionRefused` with the diagnostics when the text is
        refused; nothing is added then.
        """
        request = subc_pb2.AddRequest(lines=_lines(lines), source_name=source_name or "", request_id=request_id or "")
        return self._call(self.subscriptions.Add, request, subc_pb2.AddResponse)

    def check(self, lines: Union[str, Iterable[str]], source_name: Optional[str] = None) -> subc_pb2.CheckResponse:
        """Checks lines as `add` would, changing nothing: every diagnostic
        (up to 1,000) in the response, which `Diagnostic.from_proto` turns
        into objects."""
        request = subc_pb2.AddRequest(lines=_lines(lines), source_name=source_name or "")
        return self._call(self.subscriptions.Check, request, subc_pb2.CheckResponse)

    def get(self, id: int, app: Optional[str] = None) -> subc_pb2.Subscription:
        """One subscription, by its id in its application's numbering (each
        application numbers its own); `SubcError` with `NOT_FOUND` when that
        application has no such id. Only the administrator may name another
        `app` (default: the caller's own; the administrator's is `admin`)."""
        return self._call(self.subscriptions.Get, subc_pb2.GetRequest(id=id, app=app or ""), subc_pb2.Subscription)

    def remove(self, ids: Union[int, Iterable[int]], app: Optional[str] = None) -> subc_pb2.RemoveResponse:
        """Removes subscriptions atomically (all or none), by their ids in
        `app`'s numbering (as in `get`); returns the new generation (the
        application's own; the service's to the administrator)."""
        request = subc_pb2.RemoveRequest(ids=[ids] if isinstance(ids, int) else list(ids), app=app or "")
        return self._call(self.subscriptions.Remove, request, subc_pb2.RemoveResponse)

    def list(self, app: Optional[str] = None, page_size: int = 100) -> Iterator[subc_pb2.Subscription]:
        """Every subscription the caller can see, in id order, fetched a page
        at a time as the iterator advances. The administrator may name an
        `app` to list only its subscriptions; without one it gets every
        application's, ordered by (app, id)."""
        token = ""
        while True:
            request = subc_pb2.ListRequest(page_size=page_size, page_token=token, app=app or "")
            page = self._call(self.subscriptions.List, request, subc_pb2.ListResponse)
            yield from page.subscriptions
            if not page.next_page_token:
                return
            token = page.next_page_token

    # ------------------------------------------------------------ targets

    def register(self, name: str, kind: TargetKind, manual: bool = False) -> subc_pb2.Target:
        """Registers a target (administrator): `kind` is an `EbpfTarget`, a
        `P4RuntimeTarget`, an `AgentTarget`, a `SimTarget` or a
        `CustomTarget`. It holds nothing until `deploy`; then, unless
        `manual`, it follows every change."""
        field = _KIND_FIELDS.get(type(kind))
        if field is None:
            names = ", ".join(k.__name__ for k in _KIND_FIELDS)
            raise TypeError(f"a target is one of {names}, not {type(kind).__name__}")
        request = subc_pb2.RegisterTargetRequest(name=name, manual=manual)
        getattr(request, field).CopyFrom(kind)
        return self._call(self.targets.Register, request, subc_pb2.Target)

    def list_targets(self) -> List[subc_pb2.Target]:
        """Every registered target, with its status."""
        return list(self._call(self.targets.List, subc_pb2.ListTargetsRequest(), subc_pb2.ListTargetsResponse).targets)

    def deploy(self, name: str, timeout: Optional[float] = None) -> subc_pb2.TargetStatus:
        """Brings a target to the current generation and waits until it holds
        it, at most `timeout` seconds (None: the server's default, 30 s);
        `SubcError` with `DEADLINE_EXCEEDED` when it did not (the target
        keeps trying)."""
        timeout_ms = 0 if timeout is None else max(1, int(timeout * 1000))
        deadline = max(self._timeout or 0.0, (timeout or 30.0) + 10.0)
        return self._call(self.targets.Deploy, subc_pb2.DeployRequest(name=name, timeout_ms=timeout_ms), subc_pb2.DeployResponse, deadline).status

    def status(self, name: str) -> subc_pb2.TargetStatus:
        """A target's status: the generation it holds, its entries, its last error."""
        return self._call(self.targets.Status, subc_pb2.TargetRequest(name=name), subc_pb2.TargetStatus)

    def plan(self, name: str) -> subc_pb2.PlanResponse:
        """The diff a deploy would apply now, without applying it."""
        return self._call(self.targets.Plan, subc_pb2.TargetRequest(name=name), subc_pb2.PlanResponse)

    def remove_target(self, name: str, uninstall: bool = False) -> None:
        """Forgets a target; with `uninstall`, first removes what subc
        installed on it (otherwise its data plane keeps forwarding, unmanaged)."""
        self._call(self.targets.Remove, subc_pb2.RemoveTargetRequest(name=name, uninstall=uninstall), subc_pb2.RemoveTargetResponse)

    def set_down(self, links: Sequence[str] = (), devices: Sequence[str] = (), down: bool = True) -> subc_pb2.SetDownResponse:
        """Network mode (administrator): marks links (by index, "0", or an
        end, "leaf1:1") and devices down, or with `down=False` up again; the
        server reroutes and sends diffs to the devices whose programs change."""
        request = subc_pb2.SetDownRequest(links=list(links), devices=list(devices), down=down)
        return self._call(self.targets.SetDown, request, subc_pb2.SetDownResponse)

    def set_latency(self, latencies: Mapping[str, float]) -> subc_pb2.SetLatencyResponse:
        """Label mode (administrator): measured one-way latencies, in µs, by
        link (an end, "leaf1:1", or an index); a link's weight follows past
        20 % of the one in use, and routes move make before break. The reply
        names the devices whose forwarding changed and the ingresses moved."""
        links = [subc_pb2.LinkLatency(link=link, latency_us=us) for link, us in latencies.items()]
        return self._call(self.targets.SetLatency, subc_pb2.SetLatencyRequest(links=links), subc_pb2.SetLatencyResponse)

    def change_topology(
        self,
        add: str = "",
        remove_devices: Sequence[str] = (),
        remove_links: Sequence[str] = (),
        remove_endpoints: Sequence[str] = (),
        dry_run: bool = False,
    ) -> subc_pb2.ChangeTopologyResponse:
        """Network mode (administrator): adds devices, links and endpoints
        (`add`: `[[device]]`, `[[link]]`, `[[endpoint]]` tables of a topology
        file) and removes others (devices and endpoints by name, links by an
        end, "leaf1:1"), as one change; with `dry_run`, only says what it
        would do. The server routes again and sends diffs to the devices
        whose programs change."""
        request = subc_pb2.ChangeTopologyRequest(
            add=add,
            remove_devices=list(remove_devices),
            remove_links=list(remove_links),
            remove_endpoints=list(remove_endpoints),
            dry_run=dry_run,
        )
        return self._call(self.targets.ChangeTopology, request, subc_pb2.ChangeTopologyResponse)

    def get_topology(self) -> subc_pb2.GetTopologyResponse:
        """Network mode (administrator): the topology the server runs now,
        as a topology file, and what is down in it."""
        return self._call(self.targets.GetTopology, subc_pb2.GetTopologyRequest(), subc_pb2.GetTopologyResponse)

    # ------------------------------------------------------------ events

    def watch(self, replay: bool = False, after_seq: int = 0, timeout: Optional[float] = None) -> "Watch":
        """Streams events: with `replay`, first the stored ones after
        `after_seq`, then new ones as they happen. The stream has no deadline
        unless `timeout` (seconds) is given; end it with `Watch.cancel` or a
        `with` block. A watcher that falls too far behind gets a `SubcError`
        with `ABORTED` and can resume from the last `seq` it saw."""
        call = self.events.Watch(subc_pb2.WatchRequest(replay=replay, after_seq=after_seq), metadata=self._metadata, timeout=timeout)
        return Watch(call)


class Watch(Iterator[subc_pb2.Event]):
    """The events of `Client.watch`, as an iterator. `cancel()` ends it;
    iteration then stops."""

    def __init__(self, call: Any) -> None:
        self._call = call
        self._cancelled = False

    def __iter__(self) -> "Watch":
        return self

    def __next__(self) -> subc_pb2.Event:
        try:
            event: subc_pb2.Event = next(self._call)
            return event
        except grpc.RpcError as e:
            if self._cancelled and e.code() == grpc.StatusCode.CANCELLED:
                raise StopIteration from None
            raise error_from_rpc(e) from e

    def cancel(self) -> None:
        """Ends the stream."""
        self._cancelled = True
        self._call.cancel()

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, kind: Optional[Type[BaseException]], value: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        self.cancel()


def _split_target(target: str) -> Tuple[str, bool]:
    """`host:port` and whether the target's scheme asks for TLS."""
    for scheme, tls in (("http://", False), ("https://", True)):
        if target.startswith(scheme):
            return target[len(scheme) :].rstrip("/"), tls
    if "://" in target:
        raise ValueError(f"{target}: the target is host:port, http://host:port or https://host:port")
    return target, False


def _lines(lines: Union[str, Iterable[str]]) -> List[str]:
    # A string is one text, not an iterable of one-character lines.
    return lines.splitlines() if isinstance(lines, str) else list(lines)
