#!/usr/bin/env bash
# The compiler service end to end, on one machine (Debian 12, root):
#
#   1. installs what it needs (Debian packages; Rust through rustup when
#      cargo is missing or older than the workspace needs) and builds `subc`;
#   2. creates network namespaces: a publisher and five subscribers, joined
#      to this namespace by veth pairs;
#   3. starts `subc serve` with an embedded SQLite store;
#   4. as the application `trader`, adds the ITCH example's subscriptions
#      (and shows a mistyped one refused with `subc check`'s diagnostics);
#   5. as the administrator, registers an eBPF target (a TC program on the
#      publisher's veth; port N = subscriber N, with its MAC, IPv4 address
#      and UDP port rewritten), shows the plan, and deploys it;
#   6. replays the example pcap from the publisher and shows what each
#      subscriber received, next to what `subc sim` predicts for the
#      subscriptions the server holds;
#   7. adds a subscription while the target is live, replays, and shows the
#      difference; prints the events and some metrics;
#   8. removes everything it created: on success, on failure and on Ctrl-C.
#
#   sudo ./scripts/demo.sh                       # everything
#   sudo SUBC_SKIP_INSTALL=1 ./scripts/demo.sh   # a machine that has the packages
#   sudo SUBC_BIN=target/debug/subc ./scripts/demo.sh   # this binary, no build
#   sudo SUBC_DEMO_USER=subc ./scripts/demo.sh   # the server as that user (a
#       system user, created if missing) with only the capabilities
#       docs/server.md names, through setpriv, as dist/systemd/subc.service
#       runs it; the directories it writes are made its own
#
# Exit status 0 when every subscriber received what `subc sim` predicts.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"

log() { printf '\n==> %s\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }
trap 'printf "error: line %s: \`%s\` failed\n" "$LINENO" "$BASH_COMMAND" >&2' ERR

if [ "$(id -u)" != 0 ]; then
    echo "the demo loads eBPF programs and creates network namespaces: run it as root (sudo $0)" >&2
    exit 1
fi

# shellcheck source=scripts/rust.sh
. scripts/rust.sh

if [ "${SUBC_SKIP_INSTALL:-0}" != 1 ]; then
    log "installing Debian packages"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        build-essential pkg-config make clang llvm libelf-dev zlib1g-dev libbpf-dev \
        protobuf-compiler iproute2 util-linux python3 ca-certificates curl >/dev/null
    install_rust
fi
[ -n "${SUBC_BIN:-}" ] || rust_ok || die "Rust $RUST_MIN or later (cargo, rustc) is needed: run without SUBC_SKIP_INSTALL=1, or install it with rustup"

if [ -n "${SUBC_BIN:-}" ]; then
    SUBC="$(cd "$(dirname "$SUBC_BIN")" && pwd)/$(basename "$SUBC_BIN")"
    [ -x "$SUBC" ] || die "SUBC_BIN=$SUBC_BIN is not an executable"
else
    log "building subc (release)"
    cargo build --release --locked -p subc-cli
    SUBC="$(cd "${CARGO_TARGET_DIR:-target}" && pwd)/release/subc"
fi

if ! grep -qs ' /sys/fs/bpf bpf ' /proc/mounts; then
    mount -t bpf bpf /sys/fs/bpf
fi

# One demo at a time: the names below are fixed.
exec 9>/run/subc-demo.lock
flock -n 9 || die "another demo is running (/run/subc-demo.lock)"

TARGET=itch-demo
PIN_ROOT=/sys/fs/bpf/subc-demo
SUBSCRIBERS="1 2 3 4 5"
PORT_LIST=1,2,3,4,5
WORK="$(mktemp -d /tmp/subc-demo.XXXXXX)"
SERVER_PID=""
LISTENERS=()

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
PORT="$(free_port)"
METRICS_PORT="$(free_port)"
ADMIN_TOKEN="demo-admin-$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"
APP_TOKEN="demo-trader-$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"
export SUBC_SERVER="http://127.0.0.1:$PORT"

remove_network() {
    ip link del subc-pub 2>/dev/null || true
    ip netns del subc-publisher 2>/dev/null || true
    for n in $SUBSCRIBERS; do
        ip link del "subc-s$n" 2>/dev/null || true
        ip netns del "subc-sub$n" 2>/dev/null || true
    done
}

cleanup() {
    local status=$?
    set +e
    trap - INT TERM
    for p in "${LISTENERS[@]}"; do kill "$p" 2>/dev/null; done
    if [ -n "$SERVER_PID" ]; then
        if [ "$status" != 0 ] && [ -f "$WORK/server.log" ]; then
            echo "--- the last lines of the server's log ---" >&2
            tail -n 20 "$WORK/server.log" >&2
        fi
        # Through the server; if it is gone already (Ctrl-C reaches it too),
        # from the deployment record the eBPF loader keeps in /run/subc.
        SUBC_TOKEN="$ADMIN_TOKEN" timeout 20 "$SUBC" target rm "$TARGET" --uninstall >/dev/null 2>&1 ||
            timeout 20 "$SUBC" detach "$TARGET" >/dev/null 2>&1
        kill -TERM "$SERVER_PID" 2>/dev/null
        for _ in $(seq 100); do
            kill -0 "$SERVER_PID" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$SERVER_PID" 2>/dev/null
        wait "$SERVER_PID" 2>/dev/null
    fi
    remove_network
    rm -rf "$PIN_ROOT" "/run/subc/$TARGET" "$WORK"
    printf '\n==> cleaned up (namespaces, veth pairs, eBPF program and pins, server, %s)\n' "$WORK"
    exit "$status"
}
trap cleanup EXIT
trap 'echo "interrupted" >&2; exit 130' INT
trap 'exit 143' TERM

log "network: a publisher namespace and five subscriber namespaces"
remove_network # what an earlier, killed run may have left
ip netns add subc-publisher
ip link add subc-pub type veth peer name eth0 netns subc-publisher
ip link set subc-pub up
ip -n subc-publisher link set eth0 up
PUB_MAC="$(cat /sys/class/net/subc-pub/address)"
PORT_ARGS=()
for n in $SUBSCRIBERS; do
    ip netns add "subc-sub$n"
    ip link add "subc-s$n" type veth peer name eth0 netns "subc-sub$n"
    ip link set "subc-s$n" up
    ip -n "subc-sub$n" addr add "10.0.$n.2/24" dev eth0
    ip -n "subc-sub$n" link set eth0 up
    # The publisher's source address has no route back from here.
    ip netns exec "subc-sub$n" sh -c 'echo 0 > /proc/sys/net/ipv4/conf/all/rp_filter; echo 0 > /proc/sys/net/ipv4/conf/eth0/rp_filter'
    mac="$(ip netns exec "subc-sub$n" cat /sys/class/net/eth0/address)"
    PORT_ARGS+=(--port "$n=subc-s$n,dst_mac=$mac,dst_ip=10.0.$n.2,dst_port=7000")
    echo "    subscriber $n: namespace subc-sub$n, 10.0.$n.2 UDP 7000, behind subc-s$n"
done
echo "    publisher: namespace subc-publisher, behind subc-pub (where the program runs)"

log "starting subc serve ($SUBC_SERVER, store $WORK/subc.db)"
cat > "$WORK/subc.toml" <<EOF
spec = "$ROOT/examples/itch/itch.spec"
listen = "127.0.0.1:$PORT"
store = "$WORK/subc.db"
metrics_listen = "127.0.0.1:$METRICS_PORT"

[auth]
admin_token = "$ADMIN_TOKEN"
[[auth.apps]]
name = "trader"
token = "$APP_TOKEN"

[deploy]
bpffs_root = "$PIN_ROOT"
EOF
if [ -n "${SUBC_DEMO_USER:-}" ]; then
    # What the systemd unit does: a user of its own, the directories it
    # writes (store, pins, deployment records) owned by it, and only
    # CAP_NET_ADMIN, CAP_BPF and CAP_PERFMON, effective and ambient.
    id -u "$SUBC_DEMO_USER" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$SUBC_DEMO_USER"
    mkdir -p "$PIN_ROOT" "/run/subc/$TARGET"
    chown "$SUBC_DEMO_USER" "$WORK" "$PIN_ROOT" "/run/subc/$TARGET"
    chmod 0755 "$WORK"
    # The checkout may sit where the user cannot read (/root): the binary
    # and the spec go where it can.
    install -m 0755 "$SUBC" "$WORK/subc-server"
    sed -i "s|^spec = .*|spec = \"$WORK/itch.spec\"|" "$WORK/subc.toml"
    install -m 0644 examples/itch/itch.spec "$WORK/itch.spec"
    CAPS=+net_admin,+bpf,+perfmon
    log "the server runs as $SUBC_DEMO_USER with capabilities $CAPS only"
    setpriv --reuid="$SUBC_DEMO_USER" --regid="$(id -g "$SUBC_DEMO_USER")" --clear-groups \
        --inh-caps="-all,$CAPS" --ambient-caps="-all,$CAPS" --bounding-set="-all,$CAPS" \
        "$WORK/subc-server" serve --config "$WORK/subc.toml" 2>"$WORK/server.log" &
else
    "$SUBC" serve --config "$WORK/subc.toml" 2>"$WORK/server.log" &
fi
SERVER_PID=$!
for i in $(seq 300); do
    if SUBC_TOKEN="$APP_TOKEN" timeout 5 "$SUBC" sub ls >/dev/null 2>&1; then break; fi
    kill -0 "$SERVER_PID" 2>/dev/null || die "subc serve exited"
    [ "$i" != 300 ] || die "subc serve did not answer within 30 s"
    sleep 0.1
done
if [ -n "${SUBC_DEMO_USER:-}" ]; then
    # The process that answers is the user's, with those three capabilities
    # (bits 12, 38 and 39) and no other.
    uid="$(awk '/^Uid:/ {print $3}' "/proc/$SERVER_PID/status")"
    caps="$(awk '/^CapEff:/ {print $2}' "/proc/$SERVER_PID/status")"
    echo "    server uid $uid, effective capabilities $caps"
    [ "$uid" = "$(id -u "$SUBC_DEMO_USER")" ] && [ "$caps" = 000000c000001000 ] ||
        die "the server should run as $SUBC_DEMO_USER with CAP_NET_ADMIN, CAP_BPF and CAP_PERFMON only"
fi

log "the application adds the ITCH example's subscriptions"
sed 's/^/    /' examples/itch/rules.subs
SUBC_TOKEN="$APP_TOKEN" "$SUBC" sub add examples/itch/rules.subs

log "a subscription with a mistake is refused with the diagnostics of subc check"
if SUBC_TOKEN="$APP_TOKEN" "$SUBC" sub add -r 'stock == GOOGL && shars > 100 : fwd(3)'; then
    die "the server accepted a subscription with an unknown field"
fi

log "the administrator registers the eBPF target, looks at the plan, deploys"
export SUBC_TOKEN="$ADMIN_TOKEN"
"$SUBC" target add "$TARGET" --ebpf subc-pub --hook tc "${PORT_ARGS[@]}"
"$SUBC" target plan "$TARGET"
"$SUBC" target deploy "$TARGET" --timeout 60

# Replays the pcap from the publisher; what each subscriber received goes to $1/portN.
replay() {
    mkdir -p "$1"
    LISTENERS=()
    for n in $SUBSCRIBERS; do
        ip netns exec "subc-sub$n" python3 scripts/demo_net.py listen 7000 2 "$1/port$n" &
        LISTENERS+=($!)
    done
    sleep 0.5 # the listeners bind
    ip netns exec subc-publisher python3 scripts/demo_net.py send eth0 "$PUB_MAC" examples/itch/packets.pcap
    wait "${LISTENERS[@]}"
    LISTENERS=()
}

# What `subc sim` (the reference interpreter) decides for the pcap with the
# subscriptions the server holds now, as JSON lines in $1.
predict() {
    SUBC_TOKEN="$APP_TOKEN" "$SUBC" sub ls --json | python3 -c 'import json, sys; print("\n".join(s["text"] for s in json.load(sys.stdin)["subscriptions"]))' >"$WORK/held.subs"
    "$SUBC" sim --spec examples/itch/itch.spec "$WORK/held.subs" --pcap examples/itch/packets.pcap --json >"$1"
}

MISMATCH=0
log "replaying examples/itch/packets.pcap from the publisher: what each subscriber received"
replay "$WORK/first"
predict "$WORK/first.sim"
python3 scripts/demo_net.py compare examples/itch/packets.pcap "$WORK/first.sim" "$WORK/first" "$PORT_LIST" || MISMATCH=1

log "adding 'stock == MSFT : fwd(2)' while the target is live (a diff, not a reinstall)"
SUBC_TOKEN="$APP_TOKEN" "$SUBC" sub add -r 'stock == MSFT : fwd(2)'
for i in $(seq 100); do
    if "$SUBC" target status "$TARGET" --json | python3 -c '
import json, sys
s = json.load(sys.stdin)
sys.exit(0 if s["state"] == "TARGET_STATE_IN_SYNC" and s["deployedGeneration"] == s["currentGeneration"] else 1)'; then
        break
    fi
    [ "$i" != 100 ] || die "the target did not take the change within 10 s"
    sleep 0.1
done
"$SUBC" target status "$TARGET"

log "replaying again: what changed"
replay "$WORK/second"
python3 scripts/demo_net.py diff "$WORK/first" "$WORK/second" "$PORT_LIST"
predict "$WORK/second.sim"
python3 scripts/demo_net.py compare examples/itch/packets.pcap "$WORK/second.sim" "$WORK/second" "$PORT_LIST" || MISMATCH=1

log "events (subc watch --replay)"
timeout 3 "$SUBC" watch --replay | python3 -c '
import json, sys
for line in sys.stdin:
    e = json.loads(line)
    who = e["target"] or e["app"]
    ids, entries = e["subscriptionIds"], int(e["entries"])
    extra = "ids %s" % " ".join(ids) if ids else ("%d entries and groups written" % entries if entries else "")
    print("    %3s  %-32s generation %s  %-10s %s" % (e["seq"], e["kind"], e["generation"], who, extra))' || true

log "metrics (http://127.0.0.1:$METRICS_PORT/metrics)"
python3 -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "http://127.0.0.1:$METRICS_PORT/metrics" |
    grep -E '^subc_(subscriptions|generation|target_entries|target_generation|diff_entries_total|deploy_failures_total|commit_to_live_seconds_(sum|count))' | sed 's/^/    /' || true

if [ "$MISMATCH" != 0 ]; then
    die "a subscriber did not receive what subc sim predicts (see DIFFERENT above)"
fi
log "every subscriber received what subc sim predicts (${SECONDS} s)"
