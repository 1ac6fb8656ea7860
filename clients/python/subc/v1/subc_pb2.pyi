import datetime

from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Severity(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SEVERITY_UNSPECIFIED: _ClassVar[Severity]
    SEVERITY_ERROR: _ClassVar[Severity]
    SEVERITY_WARNING: _ClassVar[Severity]

class Hook(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HOOK_UNSPECIFIED: _ClassVar[Hook]
    HOOK_XDP: _ClassVar[Hook]
    HOOK_TC: _ClassVar[Hook]

class XdpMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    XDP_MODE_AUTO: _ClassVar[XdpMode]
    XDP_MODE_NATIVE: _ClassVar[XdpMode]
    XDP_MODE_GENERIC: _ClassVar[XdpMode]

class TargetState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TARGET_STATE_UNSPECIFIED: _ClassVar[TargetState]
    TARGET_STATE_REGISTERED: _ClassVar[TargetState]
    TARGET_STATE_IN_SYNC: _ClassVar[TargetState]
    TARGET_STATE_SYNCING: _ClassVar[TargetState]
    TARGET_STATE_FAILING: _ClassVar[TargetState]
    TARGET_STATE_BEHIND: _ClassVar[TargetState]

class EventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVENT_KIND_UNSPECIFIED: _ClassVar[EventKind]
    EVENT_KIND_SUBSCRIPTIONS_ADDED: _ClassVar[EventKind]
    EVENT_KIND_SUBSCRIPTIONS_REMOVED: _ClassVar[EventKind]
    EVENT_KIND_TARGET_REGISTERED: _ClassVar[EventKind]
    EVENT_KIND_TARGET_REMOVED: _ClassVar[EventKind]
    EVENT_KIND_DEPLOYED: _ClassVar[EventKind]
    EVENT_KIND_DEPLOY_FAILED: _ClassVar[EventKind]
    EVENT_KIND_RECONCILED: _ClassVar[EventKind]
SEVERITY_UNSPECIFIED: Severity
SEVERITY_ERROR: Severity
SEVERITY_WARNING: Severity
HOOK_UNSPECIFIED: Hook
HOOK_XDP: Hook
HOOK_TC: Hook
XDP_MODE_AUTO: XdpMode
XDP_MODE_NATIVE: XdpMode
XDP_MODE_GENERIC: XdpMode
TARGET_STATE_UNSPECIFIED: TargetState
TARGET_STATE_REGISTERED: TargetState
TARGET_STATE_IN_SYNC: TargetState
TARGET_STATE_SYNCING: TargetState
TARGET_STATE_FAILING: TargetState
TARGET_STATE_BEHIND: TargetState
EVENT_KIND_UNSPECIFIED: EventKind
EVENT_KIND_SUBSCRIPTIONS_ADDED: EventKind
EVENT_KIND_SUBSCRIPTIONS_REMOVED: EventKind
EVENT_KIND_TARGET_REGISTERED: EventKind
EVENT_KIND_TARGET_REMOVED: EventKind
EVENT_KIND_DEPLOYED: EventKind
EVENT_KIND_DEPLOY_FAILED: EventKind
EVENT_KIND_RECONCILED: EventKind

class CheckResponse(_message.Message):
    __slots__ = ("ok", "diagnostics", "total", "rendered")
    OK_FIELD_NUMBER: _ClassVar[int]
    DIAGNOSTICS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    RENDERED_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    diagnostics: _containers.RepeatedCompositeFieldContainer[Diagnostic]
    total: int
    rendered: str
    def __init__(self, ok: _Optional[bool] = ..., diagnostics: _Optional[_Iterable[_Union[Diagnostic, _Mapping]]] = ..., total: _Optional[int] = ..., rendered: _Optional[str] = ...) -> None: ...

class Subscription(_message.Message):
    __slots__ = ("id", "app", "text", "generation", "create_time")
    ID_FIELD_NUMBER: _ClassVar[int]
    APP_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    id: int
    app: str
    text: str
    generation: int
    create_time: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[int] = ..., app: _Optional[str] = ..., text: _Optional[str] = ..., generation: _Optional[int] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class AddRequest(_message.Message):
    __slots__ = ("lines", "source_name", "request_id", "validate_only")
    LINES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    lines: _containers.RepeatedScalarFieldContainer[str]
    source_name: str
    request_id: str
    validate_only: bool
    def __init__(self, lines: _Optional[_Iterable[str]] = ..., source_name: _Optional[str] = ..., request_id: _Optional[str] = ..., validate_only: _Optional[bool] = ...) -> None: ...

class TargetPreview(_message.Message):
    __slots__ = ("target", "full_install", "inserts", "modifies", "deletes", "groups_changed", "budgeted", "roots_changed")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    FULL_INSTALL_FIELD_NUMBER: _ClassVar[int]
    INSERTS_FIELD_NUMBER: _ClassVar[int]
    MODIFIES_FIELD_NUMBER: _ClassVar[int]
    DELETES_FIELD_NUMBER: _ClassVar[int]
    GROUPS_CHANGED_FIELD_NUMBER: _ClassVar[int]
    BUDGETED_FIELD_NUMBER: _ClassVar[int]
    ROOTS_CHANGED_FIELD_NUMBER: _ClassVar[int]
    target: str
    full_install: bool
    inserts: int
    modifies: int
    deletes: int
    groups_changed: int
    budgeted: bool
    roots_changed: int
    def __init__(self, target: _Optional[str] = ..., full_install: _Optional[bool] = ..., inserts: _Optional[int] = ..., modifies: _Optional[int] = ..., deletes: _Optional[int] = ..., groups_changed: _Optional[int] = ..., budgeted: _Optional[bool] = ..., roots_changed: _Optional[int] = ...) -> None: ...

class AddResponse(_message.Message):
    __slots__ = ("subscriptions", "lines", "warnings", "generation", "replayed", "validated_only", "would_write")
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    VALIDATED_ONLY_FIELD_NUMBER: _ClassVar[int]
    WOULD_WRITE_FIELD_NUMBER: _ClassVar[int]
    subscriptions: _containers.RepeatedCompositeFieldContainer[Subscription]
    lines: _containers.RepeatedScalarFieldContainer[int]
    warnings: _containers.RepeatedCompositeFieldContainer[Diagnostic]
    generation: int
    replayed: bool
    validated_only: bool
    would_write: _containers.RepeatedCompositeFieldContainer[TargetPreview]
    def __init__(self, subscriptions: _Optional[_Iterable[_Union[Subscription, _Mapping]]] = ..., lines: _Optional[_Iterable[int]] = ..., warnings: _Optional[_Iterable[_Union[Diagnostic, _Mapping]]] = ..., generation: _Optional[int] = ..., replayed: _Optional[bool] = ..., validated_only: _Optional[bool] = ..., would_write: _Optional[_Iterable[_Union[TargetPreview, _Mapping]]] = ...) -> None: ...

class RemoveRequest(_message.Message):
    __slots__ = ("ids", "app", "validate_only")
    IDS_FIELD_NUMBER: _ClassVar[int]
    APP_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    app: str
    validate_only: bool
    def __init__(self, ids: _Optional[_Iterable[int]] = ..., app: _Optional[str] = ..., validate_only: _Optional[bool] = ...) -> None: ...

class RemoveResponse(_message.Message):
    __slots__ = ("generation", "validated_only", "would_write")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    VALIDATED_ONLY_FIELD_NUMBER: _ClassVar[int]
    WOULD_WRITE_FIELD_NUMBER: _ClassVar[int]
    generation: int
    validated_only: bool
    would_write: _containers.RepeatedCompositeFieldContainer[TargetPreview]
    def __init__(self, generation: _Optional[int] = ..., validated_only: _Optional[bool] = ..., would_write: _Optional[_Iterable[_Union[TargetPreview, _Mapping]]] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("id", "app")
    ID_FIELD_NUMBER: _ClassVar[int]
    APP_FIELD_NUMBER: _ClassVar[int]
    id: int
    app: str
    def __init__(self, id: _Optional[int] = ..., app: _Optional[str] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "app")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    APP_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    app: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., app: _Optional[str] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ("subscriptions", "next_page_token", "total")
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    subscriptions: _containers.RepeatedCompositeFieldContainer[Subscription]
    next_page_token: str
    total: int
    def __init__(self, subscriptions: _Optional[_Iterable[_Union[Subscription, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., total: _Optional[int] = ...) -> None: ...

class Diagnostic(_message.Message):
    __slots__ = ("severity", "code", "message", "file", "line", "column", "end_line", "end_column", "snippet", "label", "help", "rendered")
    SEVERITY_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    COLUMN_FIELD_NUMBER: _ClassVar[int]
    END_LINE_FIELD_NUMBER: _ClassVar[int]
    END_COLUMN_FIELD_NUMBER: _ClassVar[int]
    SNIPPET_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    HELP_FIELD_NUMBER: _ClassVar[int]
    RENDERED_FIELD_NUMBER: _ClassVar[int]
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
    def __init__(self, severity: _Optional[_Union[Severity, str]] = ..., code: _Optional[str] = ..., message: _Optional[str] = ..., file: _Optional[str] = ..., line: _Optional[int] = ..., column: _Optional[int] = ..., end_line: _Optional[int] = ..., end_column: _Optional[int] = ..., snippet: _Optional[str] = ..., label: _Optional[str] = ..., help: _Optional[str] = ..., rendered: _Optional[str] = ...) -> None: ...

class Diagnostics(_message.Message):
    __slots__ = ("diagnostics", "total")
    DIAGNOSTICS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    diagnostics: _containers.RepeatedCompositeFieldContainer[Diagnostic]
    total: int
    def __init__(self, diagnostics: _Optional[_Iterable[_Union[Diagnostic, _Mapping]]] = ..., total: _Optional[int] = ...) -> None: ...

class LinkLatency(_message.Message):
    __slots__ = ("link", "latency_us")
    LINK_FIELD_NUMBER: _ClassVar[int]
    LATENCY_US_FIELD_NUMBER: _ClassVar[int]
    link: str
    latency_us: float
    def __init__(self, link: _Optional[str] = ..., latency_us: _Optional[float] = ...) -> None: ...

class SetLatencyRequest(_message.Message):
    __slots__ = ("links",)
    LINKS_FIELD_NUMBER: _ClassVar[int]
    links: _containers.RepeatedCompositeFieldContainer[LinkLatency]
    def __init__(self, links: _Optional[_Iterable[_Union[LinkLatency, _Mapping]]] = ...) -> None: ...

class SetLatencyResponse(_message.Message):
    __slots__ = ("changed", "moved", "weights_us")
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    MOVED_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_US_FIELD_NUMBER: _ClassVar[int]
    changed: _containers.RepeatedScalarFieldContainer[str]
    moved: _containers.RepeatedScalarFieldContainer[str]
    weights_us: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, changed: _Optional[_Iterable[str]] = ..., moved: _Optional[_Iterable[str]] = ..., weights_us: _Optional[_Iterable[float]] = ...) -> None: ...

class ChangeTopologyRequest(_message.Message):
    __slots__ = ("add", "remove_devices", "remove_links", "remove_endpoints", "dry_run")
    ADD_FIELD_NUMBER: _ClassVar[int]
    REMOVE_DEVICES_FIELD_NUMBER: _ClassVar[int]
    REMOVE_LINKS_FIELD_NUMBER: _ClassVar[int]
    REMOVE_ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    add: str
    remove_devices: _containers.RepeatedScalarFieldContainer[str]
    remove_links: _containers.RepeatedScalarFieldContainer[str]
    remove_endpoints: _containers.RepeatedScalarFieldContainer[str]
    dry_run: bool
    def __init__(self, add: _Optional[str] = ..., remove_devices: _Optional[_Iterable[str]] = ..., remove_links: _Optional[_Iterable[str]] = ..., remove_endpoints: _Optional[_Iterable[str]] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class ChangeTopologyResponse(_message.Message):
    __slots__ = ("added", "removed", "changed", "generation", "topology")
    ADDED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    added: _containers.RepeatedScalarFieldContainer[str]
    removed: _containers.RepeatedScalarFieldContainer[str]
    changed: _containers.RepeatedScalarFieldContainer[str]
    generation: int
    topology: str
    def __init__(self, added: _Optional[_Iterable[str]] = ..., removed: _Optional[_Iterable[str]] = ..., changed: _Optional[_Iterable[str]] = ..., generation: _Optional[int] = ..., topology: _Optional[str] = ...) -> None: ...

class GetTopologyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetTopologyResponse(_message.Message):
    __slots__ = ("topology", "links_down", "devices_down")
    TOPOLOGY_FIELD_NUMBER: _ClassVar[int]
    LINKS_DOWN_FIELD_NUMBER: _ClassVar[int]
    DEVICES_DOWN_FIELD_NUMBER: _ClassVar[int]
    topology: str
    links_down: _containers.RepeatedScalarFieldContainer[int]
    devices_down: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, topology: _Optional[str] = ..., links_down: _Optional[_Iterable[int]] = ..., devices_down: _Optional[_Iterable[str]] = ...) -> None: ...

class SetDownRequest(_message.Message):
    __slots__ = ("links", "devices", "down")
    LINKS_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    DOWN_FIELD_NUMBER: _ClassVar[int]
    links: _containers.RepeatedScalarFieldContainer[str]
    devices: _containers.RepeatedScalarFieldContainer[str]
    down: bool
    def __init__(self, links: _Optional[_Iterable[str]] = ..., devices: _Optional[_Iterable[str]] = ..., down: _Optional[bool] = ...) -> None: ...

class SetDownResponse(_message.Message):
    __slots__ = ("links_down", "devices_down", "changed", "generation")
    LINKS_DOWN_FIELD_NUMBER: _ClassVar[int]
    DEVICES_DOWN_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    links_down: _containers.RepeatedScalarFieldContainer[int]
    devices_down: _containers.RepeatedScalarFieldContainer[str]
    changed: _containers.RepeatedScalarFieldContainer[str]
    generation: int
    def __init__(self, links_down: _Optional[_Iterable[int]] = ..., devices_down: _Optional[_Iterable[str]] = ..., changed: _Optional[_Iterable[str]] = ..., generation: _Optional[int] = ...) -> None: ...

class EbpfTarget(_message.Message):
    __slots__ = ("interface", "hook", "ports", "drop_unmatched", "xdp_mode")
    class PortsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: EbpfEgress
        def __init__(self, key: _Optional[int] = ..., value: _Optional[_Union[EbpfEgress, _Mapping]] = ...) -> None: ...
    INTERFACE_FIELD_NUMBER: _ClassVar[int]
    HOOK_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    DROP_UNMATCHED_FIELD_NUMBER: _ClassVar[int]
    XDP_MODE_FIELD_NUMBER: _ClassVar[int]
    interface: str
    hook: Hook
    ports: _containers.MessageMap[int, EbpfEgress]
    drop_unmatched: bool
    xdp_mode: XdpMode
    def __init__(self, interface: _Optional[str] = ..., hook: _Optional[_Union[Hook, str]] = ..., ports: _Optional[_Mapping[int, EbpfEgress]] = ..., drop_unmatched: _Optional[bool] = ..., xdp_mode: _Optional[_Union[XdpMode, str]] = ...) -> None: ...

class EbpfEgress(_message.Message):
    __slots__ = ("interface", "dst_mac", "src_mac", "dst_ip", "dst_port")
    INTERFACE_FIELD_NUMBER: _ClassVar[int]
    DST_MAC_FIELD_NUMBER: _ClassVar[int]
    SRC_MAC_FIELD_NUMBER: _ClassVar[int]
    DST_IP_FIELD_NUMBER: _ClassVar[int]
    DST_PORT_FIELD_NUMBER: _ClassVar[int]
    interface: str
    dst_mac: str
    src_mac: str
    dst_ip: str
    dst_port: int
    def __init__(self, interface: _Optional[str] = ..., dst_mac: _Optional[str] = ..., src_mac: _Optional[str] = ..., dst_ip: _Optional[str] = ..., dst_port: _Optional[int] = ...) -> None: ...

class P4RuntimeTarget(_message.Message):
    __slots__ = ("address", "device_id", "p4info", "device_config", "ports", "election_id", "tls", "arch", "budget", "receivers")
    class PortsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    P4INFO_FIELD_NUMBER: _ClassVar[int]
    DEVICE_CONFIG_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    ELECTION_ID_FIELD_NUMBER: _ClassVar[int]
    TLS_FIELD_NUMBER: _ClassVar[int]
    ARCH_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    RECEIVERS_FIELD_NUMBER: _ClassVar[int]
    address: str
    device_id: int
    p4info: bytes
    device_config: bytes
    ports: _containers.ScalarMap[int, int]
    election_id: int
    tls: P4RuntimeTls
    arch: str
    budget: int
    receivers: str
    def __init__(self, address: _Optional[str] = ..., device_id: _Optional[int] = ..., p4info: _Optional[bytes] = ..., device_config: _Optional[bytes] = ..., ports: _Optional[_Mapping[int, int]] = ..., election_id: _Optional[int] = ..., tls: _Optional[_Union[P4RuntimeTls, _Mapping]] = ..., arch: _Optional[str] = ..., budget: _Optional[int] = ..., receivers: _Optional[str] = ...) -> None: ...

class P4RuntimeTls(_message.Message):
    __slots__ = ("ca_cert_file", "client_cert_file", "client_key_file", "server_name")
    CA_CERT_FILE_FIELD_NUMBER: _ClassVar[int]
    CLIENT_CERT_FILE_FIELD_NUMBER: _ClassVar[int]
    CLIENT_KEY_FILE_FIELD_NUMBER: _ClassVar[int]
    SERVER_NAME_FIELD_NUMBER: _ClassVar[int]
    ca_cert_file: str
    client_cert_file: str
    client_key_file: str
    server_name: str
    def __init__(self, ca_cert_file: _Optional[str] = ..., client_cert_file: _Optional[str] = ..., client_key_file: _Optional[str] = ..., server_name: _Optional[str] = ...) -> None: ...

class SimTarget(_message.Message):
    __slots__ = ("path",)
    PATH_FIELD_NUMBER: _ClassVar[int]
    path: str
    def __init__(self, path: _Optional[str] = ...) -> None: ...

class AgentTarget(_message.Message):
    __slots__ = ("address", "program", "tls", "insecure")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_FIELD_NUMBER: _ClassVar[int]
    TLS_FIELD_NUMBER: _ClassVar[int]
    INSECURE_FIELD_NUMBER: _ClassVar[int]
    address: str
    program: EbpfTarget
    tls: P4RuntimeTls
    insecure: bool
    def __init__(self, address: _Optional[str] = ..., program: _Optional[_Union[EbpfTarget, _Mapping]] = ..., tls: _Optional[_Union[P4RuntimeTls, _Mapping]] = ..., insecure: _Optional[bool] = ...) -> None: ...

class CustomTarget(_message.Message):
    __slots__ = ("kind", "options")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    KIND_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    options: _containers.ScalarMap[str, str]
    def __init__(self, kind: _Optional[str] = ..., options: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RegisterTargetRequest(_message.Message):
    __slots__ = ("name", "ebpf", "p4runtime", "sim", "custom", "agent", "manual")
    NAME_FIELD_NUMBER: _ClassVar[int]
    EBPF_FIELD_NUMBER: _ClassVar[int]
    P4RUNTIME_FIELD_NUMBER: _ClassVar[int]
    SIM_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    MANUAL_FIELD_NUMBER: _ClassVar[int]
    name: str
    ebpf: EbpfTarget
    p4runtime: P4RuntimeTarget
    sim: SimTarget
    custom: CustomTarget
    agent: AgentTarget
    manual: bool
    def __init__(self, name: _Optional[str] = ..., ebpf: _Optional[_Union[EbpfTarget, _Mapping]] = ..., p4runtime: _Optional[_Union[P4RuntimeTarget, _Mapping]] = ..., sim: _Optional[_Union[SimTarget, _Mapping]] = ..., custom: _Optional[_Union[CustomTarget, _Mapping]] = ..., agent: _Optional[_Union[AgentTarget, _Mapping]] = ..., manual: _Optional[bool] = ...) -> None: ...

class Target(_message.Message):
    __slots__ = ("name", "ebpf", "p4runtime", "sim", "custom", "agent", "manual", "status")
    NAME_FIELD_NUMBER: _ClassVar[int]
    EBPF_FIELD_NUMBER: _ClassVar[int]
    P4RUNTIME_FIELD_NUMBER: _ClassVar[int]
    SIM_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    MANUAL_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    name: str
    ebpf: EbpfTarget
    p4runtime: P4RuntimeTarget
    sim: SimTarget
    custom: CustomTarget
    agent: AgentTarget
    manual: bool
    status: TargetStatus
    def __init__(self, name: _Optional[str] = ..., ebpf: _Optional[_Union[EbpfTarget, _Mapping]] = ..., p4runtime: _Optional[_Union[P4RuntimeTarget, _Mapping]] = ..., sim: _Optional[_Union[SimTarget, _Mapping]] = ..., custom: _Optional[_Union[CustomTarget, _Mapping]] = ..., agent: _Optional[_Union[AgentTarget, _Mapping]] = ..., manual: _Optional[bool] = ..., status: _Optional[_Union[TargetStatus, _Mapping]] = ...) -> None: ...

class ListTargetsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTargetsResponse(_message.Message):
    __slots__ = ("targets",)
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    targets: _containers.RepeatedCompositeFieldContainer[Target]
    def __init__(self, targets: _Optional[_Iterable[_Union[Target, _Mapping]]] = ...) -> None: ...

class RemoveTargetRequest(_message.Message):
    __slots__ = ("name", "uninstall")
    NAME_FIELD_NUMBER: _ClassVar[int]
    UNINSTALL_FIELD_NUMBER: _ClassVar[int]
    name: str
    uninstall: bool
    def __init__(self, name: _Optional[str] = ..., uninstall: _Optional[bool] = ...) -> None: ...

class RemoveTargetResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TargetRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeployRequest(_message.Message):
    __slots__ = ("name", "timeout_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    timeout_ms: int
    def __init__(self, name: _Optional[str] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class DeployResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: TargetStatus
    def __init__(self, status: _Optional[_Union[TargetStatus, _Mapping]] = ...) -> None: ...

class TargetStatus(_message.Message):
    __slots__ = ("name", "state", "deployed_generation", "current_generation", "entries", "groups", "last_error", "consecutive_failures", "last_diff_entries", "last_deploy_time", "port_counters", "approximation")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DEPLOYED_GENERATION_FIELD_NUMBER: _ClassVar[int]
    CURRENT_GENERATION_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    CONSECUTIVE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    LAST_DIFF_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    LAST_DEPLOY_TIME_FIELD_NUMBER: _ClassVar[int]
    PORT_COUNTERS_FIELD_NUMBER: _ClassVar[int]
    APPROXIMATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    state: TargetState
    deployed_generation: int
    current_generation: int
    entries: int
    groups: int
    last_error: str
    consecutive_failures: int
    last_diff_entries: int
    last_deploy_time: _timestamp_pb2.Timestamp
    port_counters: _containers.RepeatedCompositeFieldContainer[PortCounter]
    approximation: Approximation
    def __init__(self, name: _Optional[str] = ..., state: _Optional[_Union[TargetState, str]] = ..., deployed_generation: _Optional[int] = ..., current_generation: _Optional[int] = ..., entries: _Optional[int] = ..., groups: _Optional[int] = ..., last_error: _Optional[str] = ..., consecutive_failures: _Optional[int] = ..., last_diff_entries: _Optional[int] = ..., last_deploy_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., port_counters: _Optional[_Iterable[_Union[PortCounter, _Mapping]]] = ..., approximation: _Optional[_Union[Approximation, _Mapping]] = ...) -> None: ...

class Approximation(_message.Message):
    __slots__ = ("budget", "entries", "dropped_fields", "sampled_packets", "exact_deliveries", "extra_deliveries", "packets_with_extra", "missing_deliveries", "refits")
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_PACKETS_FIELD_NUMBER: _ClassVar[int]
    EXACT_DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    EXTRA_DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    PACKETS_WITH_EXTRA_FIELD_NUMBER: _ClassVar[int]
    MISSING_DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    REFITS_FIELD_NUMBER: _ClassVar[int]
    budget: int
    entries: int
    dropped_fields: _containers.RepeatedScalarFieldContainer[str]
    sampled_packets: int
    exact_deliveries: int
    extra_deliveries: int
    packets_with_extra: int
    missing_deliveries: int
    refits: int
    def __init__(self, budget: _Optional[int] = ..., entries: _Optional[int] = ..., dropped_fields: _Optional[_Iterable[str]] = ..., sampled_packets: _Optional[int] = ..., exact_deliveries: _Optional[int] = ..., extra_deliveries: _Optional[int] = ..., packets_with_extra: _Optional[int] = ..., missing_deliveries: _Optional[int] = ..., refits: _Optional[int] = ...) -> None: ...

class PortCounter(_message.Message):
    __slots__ = ("port", "packets", "bytes")
    PORT_FIELD_NUMBER: _ClassVar[int]
    PACKETS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    port: int
    packets: int
    bytes: int
    def __init__(self, port: _Optional[int] = ..., packets: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class PlanResponse(_message.Message):
    __slots__ = ("from_generation", "to_generation", "full_install", "inserts", "modifies", "deletes", "groups_changed", "ops", "truncated")
    FROM_GENERATION_FIELD_NUMBER: _ClassVar[int]
    TO_GENERATION_FIELD_NUMBER: _ClassVar[int]
    FULL_INSTALL_FIELD_NUMBER: _ClassVar[int]
    INSERTS_FIELD_NUMBER: _ClassVar[int]
    MODIFIES_FIELD_NUMBER: _ClassVar[int]
    DELETES_FIELD_NUMBER: _ClassVar[int]
    GROUPS_CHANGED_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    from_generation: int
    to_generation: int
    full_install: bool
    inserts: int
    modifies: int
    deletes: int
    groups_changed: int
    ops: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Struct]
    truncated: bool
    def __init__(self, from_generation: _Optional[int] = ..., to_generation: _Optional[int] = ..., full_install: _Optional[bool] = ..., inserts: _Optional[int] = ..., modifies: _Optional[int] = ..., deletes: _Optional[int] = ..., groups_changed: _Optional[int] = ..., ops: _Optional[_Iterable[_Union[_struct_pb2.Struct, _Mapping]]] = ..., truncated: _Optional[bool] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("replay", "after_seq")
    REPLAY_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    replay: bool
    after_seq: int
    def __init__(self, replay: _Optional[bool] = ..., after_seq: _Optional[int] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("seq", "time", "kind", "generation", "app", "subscription_ids", "target", "entries", "error")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    APP_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_IDS_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    seq: int
    time: _timestamp_pb2.Timestamp
    kind: EventKind
    generation: int
    app: str
    subscription_ids: _containers.RepeatedScalarFieldContainer[int]
    target: str
    entries: int
    error: str
    def __init__(self, seq: _Optional[int] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., kind: _Optional[_Union[EventKind, str]] = ..., generation: _Optional[int] = ..., app: _Optional[str] = ..., subscription_ids: _Optional[_Iterable[int]] = ..., target: _Optional[str] = ..., entries: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...
