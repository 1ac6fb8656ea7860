#!/usr/bin/env python3
"""Traffic and reports for scripts/demo.sh (standard library only).

  demo_net.py send IFACE DST_MAC PCAP      send a pcap's frames out of IFACE,
                                           destination MAC rewritten (root)
  demo_net.py listen PORT SECONDS OUT      record the stock of every ITCH
                                           add order arriving on UDP PORT for
                                           SECONDS, one per line, into OUT
  demo_net.py compare PCAP SIM GOT PORTS   per port: what arrived (GOT/portN)
                                           next to what `subc sim --json`
                                           (file SIM) predicts; exit 1 if
                                           they differ
  demo_net.py diff BEFORE AFTER PORTS      per port: what the second replay
                                           delivered beyond the first

Run send and listen inside the network namespace they belong to
(`ip netns exec`). PORTS is a comma-separated list of port numbers.
"""
import collections
import json
import os
import socket
import struct
import sys
import time

# In an ITCH add order inside MoldUDP64: the MoldUDP64 header (20 bytes),
# the message length (2) and type (1), then 23 bytes up to the stock (8).
STOCK = slice(46, 54)


def frames(path):
    with open(path, "rb") as f:
        data = f.read()
    magic = data[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        endian = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        endian = ">"
    else:
        sys.exit(f"{path}: not a classic pcap file")
    off = 24
    while off + 16 <= len(data):
        _, _, incl, _ = struct.unpack(endian + "IIII", data[off:off + 16])
        yield data[off + 16:off + 16 + incl]
        off += 16 + incl


def stock_of_frame(f):
    # Ethernet (14), IPv4 without options (20), UDP (8), then the payload.
    return f[42:][STOCK].decode("ascii", "replace").strip()


def send(iface, dst_mac, pcap):
    mac = bytes(int(b, 16) for b in dst_mac.split(":"))
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    s.bind((iface, 0))
    n = 0
    for f in frames(pcap):
        s.send(mac + f[6:])
        n += 1
        time.sleep(0.002)
    print(f"    the publisher sent {n} frames", file=sys.stderr)


def listen(port, seconds, out):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", int(port)))
    s.settimeout(0.1)
    stocks = []
    end = time.time() + float(seconds)
    while time.time() < end:
        try:
            d = s.recv(2048)
        except socket.timeout:
            continue
        stocks.append(d[STOCK].decode("ascii", "replace").strip())
    with open(out, "w") as f:
        f.write("".join(s + "\n" for s in stocks))


def received(path):
    try:
        with open(path) as f:
            return [line.strip() for line in f if line.strip()]
    except FileNotFoundError:
        return []


def summary(stocks):
    c = collections.Counter(stocks)
    return ", ".join(f"{s} x{n}" for s, n in sorted(c.items())) or "-"


def compare(pcap, sim, got, ports):
    stocks = [stock_of_frame(f) for f in frames(pcap)]
    want = collections.defaultdict(list)
    with open(sim) as f:
        for line in f:
            d = json.loads(line)
            for p in d["ports"]:
                want[p].append(stocks[d["packet"]])
    ok = True
    print(f"    {'port':<6}{'received':<34}{'subc sim predicts':<34}")
    for p in ports:
        have = received(os.path.join(got, f"port{p}"))
        same = collections.Counter(have) == collections.Counter(want[p])
        ok &= same
        print(f"    {p:<6}{summary(have):<34}{summary(want[p]):<34}{'same' if same else 'DIFFERENT'}")
    return ok


def diff(before, after, ports):
    for p in ports:
        a = collections.Counter(received(os.path.join(before, f"port{p}")))
        b = collections.Counter(received(os.path.join(after, f"port{p}")))
        more, less = b - a, a - b
        change = ", ".join([f"+{s} x{n}" for s, n in sorted(more.items())] + [f"-{s} x{n}" for s, n in sorted(less.items())])
        print(f"    port {p}: {sum(a.values())} -> {sum(b.values())} messages  {change or '(unchanged)'}")


if __name__ == "__main__":
    cmd, args = sys.argv[1:2], sys.argv[2:]
    if cmd == ["send"] and len(args) == 3:
        send(*args)
    elif cmd == ["listen"] and len(args) == 3:
        listen(*args)
    elif cmd == ["compare"] and len(args) == 4:
        sys.exit(0 if compare(args[0], args[1], args[2], [int(p) for p in args[3].split(",")]) else 1)
    elif cmd == ["diff"] and len(args) == 3:
        diff(args[0], args[1], [int(p) for p in args[2].split(",")])
    else:
        sys.exit(__doc__)
