#!/usr/bin/env python3
"""Checks subc's P4Runtime output with the official `p4runtime` package.

    PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python python3 scripts/check_p4runtime.py DIR...

Each DIR holds `program.p4info.txtpb` and `p4info.bin` and any number of
WriteRequests as `NAME.bin` with `NAME.txtpb` beside it (`entries`,
`mcast`, `update-007`, ...). For every directory this parses the P4Info in
both formats and requires them equal, then parses every WriteRequest in both
formats, requires them equal, and checks each update against the P4Info the
way a P4Runtime server would: known table, action, match field and parameter
ids, the table's match kinds, canonical byte strings (P4Runtime 1.x section
8.4) that fit the declared bitwidths, masked ternary and LPM values, and
priorities exactly on ternary and range tables.
"""

import sys
from pathlib import Path

from google.protobuf import text_format
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2


class Failure(Exception):
    pass


def canonical(b, width, what):
    if len(b) == 0:
        raise Failure(f"{what}: empty byte string")
    if len(b) > 1 and b[0] == 0:
        raise Failure(f"{what}: {b.hex()} has a leading zero byte")
    if int.from_bytes(b, "big").bit_length() > width:
        raise Failure(f"{what}: {b.hex()} does not fit in {width} bits")
    return int.from_bytes(b, "big")


def load_pair(path_bin, path_txt, message):
    binary = message()
    binary.ParseFromString(path_bin.read_bytes())
    text = message()
    text_format.Parse(path_txt.read_text(), text)
    if binary != text:
        raise Failure(f"{path_bin.name} and {path_txt.name} differ")
    return binary


def check_update(u, info, where):
    tables = {t.preamble.id: t for t in info.tables}
    actions = {a.preamble.id: a for a in info.actions}
    which = u.entity.WhichOneof("entity")
    if which == "packet_replication_engine_entry":
        g = u.entity.packet_replication_engine_entry.multicast_group_entry
        if g.multicast_group_id == 0:
            raise Failure(f"{where}: multicast group 0")
        ports = [r.egress_port for r in g.replicas]
        if u.type != p4runtime_pb2.Update.DELETE and (not ports or len(set(ports)) != len(ports)):
            raise Failure(f"{where}: bad replicas {ports}")
        return
    if which != "table_entry":
        raise Failure(f"{where}: unexpected entity {which}")
    e = u.entity.table_entry
    t = tables.get(e.table_id)
    if t is None:
        raise Failure(f"{where}: no table {e.table_id}")
    name = t.preamble.name
    fields = {f.id: f for f in t.match_fields}
    kinds = {f.id: p4info_pb2.MatchField.MatchType.Name(f.match_type) for f in t.match_fields}
    needs_priority = any(k in ("TERNARY", "RANGE", "OPTIONAL") for k in kinds.values())
    if e.is_default_action:
        if u.type != p4runtime_pb2.Update.MODIFY or len(e.match) or e.priority:
            raise Failure(f"{where}: {name}: a default entry is only modified, without match or priority")
    else:
        seen = set()
        for m in e.match:
            f = fields.get(m.field_id)
            if f is None or m.field_id in seen:
                raise Failure(f"{where}: {name}: bad match field {m.field_id}")
            seen.add(m.field_id)
            kind = m.WhichOneof("field_match_type").upper()
            if kind != kinds[m.field_id]:
                raise Failure(f"{where}: {name}: {kind} match on a {kinds[m.field_id]} field")
            w = f.bitwidth
            what = f"{where}: {name}.{f.name}"
            if kind == "EXACT":
                canonical(m.exact.value, w, what)
            elif kind == "TERNARY":
                v, mask = canonical(m.ternary.value, w, what), canonical(m.ternary.mask, w, what)
                if mask == 0 or v & ~mask:
                    raise Failure(f"{what}: ternary value not masked, or a zero mask")
            elif kind == "LPM":
                v = canonical(m.lpm.value, w, what)
                if not 0 < m.lpm.prefix_len <= w or v & ((1 << (w - m.lpm.prefix_len)) - 1):
                    raise Failure(f"{what}: bad prefix")
            elif kind == "RANGE":
                lo, hi = canonical(m.range.low, w, what), canonical(m.range.high, w, what)
                if lo > hi or (lo == 0 and hi == (1 << w) - 1):
                    raise Failure(f"{what}: bad range {lo}..{hi}")
        missing = [fid for fid, k in kinds.items() if k == "EXACT" and fid not in seen]
        if missing:
            raise Failure(f"{where}: {name}: exact fields {missing} left out")
        if needs_priority != (e.priority > 0):
            raise Failure(f"{where}: {name}: priority {e.priority}")
    if u.type == p4runtime_pb2.Update.DELETE:
        return
    a = e.action.action
    if a.action_id not in {r.id for r in t.action_refs}:
        raise Failure(f"{where}: {name}: action {a.action_id} is not one of the table's")
    params = {p.id: p for p in actions[a.action_id].params}
    if [p.param_id for p in a.params] != [p.id for p in actions[a.action_id].params]:
        raise Failure(f"{where}: {name}: parameters {[p.param_id for p in a.params]}")
    for p in a.params:
        canonical(p.value, params[p.param_id].bitwidth, f"{where}: {name} parameter {params[p.param_id].name}")


def check_dir(d):
    info = load_pair(d / "p4info.bin", d / "program.p4info.txtpb", p4info_pb2.P4Info)
    updates = 0
    requests = 0
    for b in sorted(d.glob("*.bin")):
        if b.name == "p4info.bin":
            continue
        w = load_pair(b, b.with_suffix(".txtpb"), p4runtime_pb2.WriteRequest)
        for i, u in enumerate(w.updates):
            check_update(u, info, f"{d.name}/{b.name} update {i}")
        updates += len(w.updates)
        requests += 1
    return len(info.tables), requests, updates


def main(dirs):
    if not dirs:
        sys.exit(f"usage: {sys.argv[0]} DIR...")
    failed = False
    total = [0, 0]
    for d in map(Path, dirs):
        try:
            tables, requests, updates = check_dir(d)
            total[0] += requests
            total[1] += updates
            print(f"{d.name}: P4Info ({tables} tables) and {requests} WriteRequests ({updates} updates) parse and check")
        except (Failure, text_format.ParseError, Exception) as e:  # noqa: BLE001 - report every kind of failure
            failed = True
            print(f"{d.name}: FAILED: {type(e).__name__}: {e}")
    print(f"p4runtime package: {len(dirs)} programs, {total[0]} WriteRequests, {total[1]} updates")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main(sys.argv[1:])
