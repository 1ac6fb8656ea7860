#!/usr/bin/env bash
# Runs every test of subc on a fresh Debian 12 machine: installs what the
# tests need (Debian packages, Rust components, a Python virtual environment
# for the P4Runtime checks), then builds and tests the whole workspace.
#
#   ./scripts/test.sh            # everything
#   SUBC_SKIP_INSTALL=1 ./scripts/test.sh   # skip the installs on a machine that has them
#
# Kernel (eBPF) tests need root; under CI=true they must run, never skip.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step's line says when it started (seconds since the script began),
# so a CI log shows where the time goes.
log() { printf '\n==> [%ds] %s\n' "$SECONDS" "$*"; }

# shellcheck source=scripts/rust.sh
. scripts/rust.sh

if [ "${SUBC_SKIP_INSTALL:-0}" != 1 ]; then
    log "installing Debian packages"
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
        build-essential pkg-config make clang llvm libelf-dev zlib1g-dev libbpf-dev \
        graphviz iproute2 python3 python3-venv ca-certificates curl >/dev/null
    # protoc and its well-known types for etcd-client's generated stubs; etcd itself for the
    # replicated store's tests (crates/server/tests/etcd.rs).
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends protobuf-compiler libprotobuf-dev etcd-server >/dev/null
    # Real captures for crates/cli/tests/capture.rs: tcpdump, and dumpcap from tshark.
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends tcpdump tshark >/dev/null
    # A headless browser and its WebDriver for the dashboard's test (crates/server/tests/dashboard.rs).
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
    install_rust
    # The minimal profile has no rustfmt; the format check below needs it.
    if ! cargo fmt --version >/dev/null 2>&1 && command -v rustup >/dev/null; then
        rustup component add rustfmt
    fi
    # Nor clippy, which the lint step below runs.
    if ! cargo clippy --version >/dev/null 2>&1 && command -v rustup >/dev/null; then
        rustup component add clippy
    fi
fi
rust_ok || { echo "error: Rust $RUST_MIN or later (cargo, rustc) is needed" >&2; exit 1; }

log "toolchain: $(cargo --version), $(clang --version | head -1)"

# The eBPF back end's kernel tests load programs (root) and its end-to-end
# test pins nothing but the CLI does: mount bpffs if it is not mounted.
if [ "$(id -u)" = 0 ] && ! grep -qs ' /sys/fs/bpf bpf ' /proc/mounts; then
    mount -t bpf bpf /sys/fs/bpf || log "warning: cannot mount bpffs on /sys/fs/bpf"
fi

# The P4 back end's bytes are checked with the official `p4runtime` package
# from PyPI, in a virtual environment of this script's own (its generated
# code needs the pure-Python protobuf). The same package also proves that
# proto/p4runtime/p4runtime.fds.bin is what scripts/p4runtime_fds.py extracts.
P4RT_VENV="${CARGO_TARGET_DIR:-target}/p4runtime-venv"
if ! cmp -s scripts/p4runtime-requirements.txt "$P4RT_VENV/requirements.txt"; then
    log "installing the p4runtime Python package into $P4RT_VENV"
    rm -rf "$P4RT_VENV"
    python3 -m venv "$P4RT_VENV"
    "$P4RT_VENV/bin/pip" install -q --disable-pip-version-check -r scripts/p4runtime-requirements.txt
    cp scripts/p4runtime-requirements.txt "$P4RT_VENV/requirements.txt"
fi
P4RUNTIME_PYTHON="$(cd "$P4RT_VENV/bin" && pwd)/python"
export P4RUNTIME_PYTHON
PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python "$P4RUNTIME_PYTHON" scripts/p4runtime_fds.py --check proto/p4runtime/p4runtime.fds.bin

# The Python client package (clients/python) is tested against a live server
# (crates/server/tests/python_client.rs) in a virtual environment of its
# own: its protobuf is the current one, which the p4runtime package's
# generated code cannot use. The pinned requirements are installed when they
# change; the package itself on every run (it is small), so the tests never
# see a stale copy.
GRPC_VENV="${CARGO_TARGET_DIR:-target}/grpcio-venv"
GRPC_REQUIREMENTS=clients/python/requirements-dev.txt
if ! cmp -s "$GRPC_REQUIREMENTS" "$GRPC_VENV/requirements.txt"; then
    log "installing the Python client's requirements into $GRPC_VENV"
    rm -rf "$GRPC_VENV"
    python3 -m venv "$GRPC_VENV"
    "$GRPC_VENV/bin/pip" install -q --disable-pip-version-check -r "$GRPC_REQUIREMENTS"
    cp "$GRPC_REQUIREMENTS" "$GRPC_VENV/requirements.txt"
fi
"$GRPC_VENV/bin/pip" install -q --disable-pip-version-check --no-deps --no-build-isolation --force-reinstall ./clients/python
SUBC_PYTHON="$(cd "$GRPC_VENV/bin" && pwd)/python"
export SUBC_PYTHON
log "checking the Python client: stubs as generated from proto/subc/v1/subc.proto, types (mypy)"
"$SUBC_PYTHON" clients/python/generate.py --check
(cd clients/python && "$SUBC_PYTHON" -m mypy)

GO="$(command -v go || echo /usr/local/go/bin/go)"

# grpcurl, with server reflection only, reads the API and a refusal's details
# (crates/server/tests/grpcurl.rs); built from its module with Go.
GRPCURL_VERSION=v1.9.4
GRPCURL_DIR="${CARGO_TARGET_DIR:-target}/tools/grpcurl-$GRPCURL_VERSION"
if [ ! -x "$GRPCURL_DIR/grpcurl" ]; then
    if [ -x "$GO" ]; then
        log "installing grpcurl $GRPCURL_VERSION into $GRPCURL_DIR"
        mkdir -p "$GRPCURL_DIR"
        GOBIN="$(cd "$GRPCURL_DIR" && pwd)" GOTOOLCHAIN=local "$GO" install "github.com/fullstorydev/grpcurl/cmd/grpcurl@$GRPCURL_VERSION"
    else
        log "warning: no Go toolchain: the grpcurl test will skip (and fail under CI=true)"
    fi
fi
if [ -x "$GRPCURL_DIR/grpcurl" ]; then
    GRPCURL="$(cd "$GRPCURL_DIR" && pwd)/grpcurl"
    export GRPCURL
fi

# The Go client module (clients/go) is tested against a live server
# (crates/server/tests/go_client.rs, which SUBC_GO enables). Its committed
# stubs must equal a fresh generation by the plugins generate.sh pins
# (installed with `go install`); gofmt and go vet check the package. Modules
# come through the module proxy at go.sum's hashes; they, the plugins and the
# build cache live in $CARGO_TARGET_DIR/tools/go.
if [ -x "$GO" ]; then
    log "checking the Go client: stubs as generated from proto/subc/v1/subc.proto, gofmt, go vet"
    SUBC_GO="$GO" clients/go/generate.sh --check
    unformatted="$("$(GOTOOLCHAIN=local "$GO" env GOROOT)/bin/gofmt" -l clients/go)"
    if [ -n "$unformatted" ]; then
        echo "error: not gofmt-formatted: $unformatted" >&2
        exit 1
    fi
    GO_TOOLS="$(cd "${CARGO_TARGET_DIR:-target}/tools/go" && pwd)"
    (cd clients/go && GOTOOLCHAIN=local GOPATH="$GO_TOOLS" GOMODCACHE="$GO_TOOLS/pkg/mod" GOCACHE="$GO_TOOLS/cache" \
        GOFLAGS="-mod=readonly -modcacherw" "$GO" vet ./...)
    SUBC_GO="$GO"
    export SUBC_GO
else
    log "warning: no Go toolchain: the Go client's test will skip (and fail under CI=true)"
fi

log "checking formatting (rustfmt.toml)"
if cargo fmt --version >/dev/null 2>&1; then
    cargo fmt --all --check
elif [ "${CI:-}" = true ]; then
    echo "error: rustfmt is not installed (CI=true: the format check must run)" >&2
    exit 1
else
    log "rustfmt is not installed: skipping the format check"
fi

log "checking ARCHITECTURE.md (every crate and module named, under 250 lines)"
python3 scripts/check_architecture.py

log "checking that subc-client pulls in no compiler, store or data plane"
# An application that depends on the client gets tonic and prost, not
# vendored libbpf, bundled SQLite or an HTTP server (ARCHITECTURE.md).
if cargo tree -p subc-client --locked -e normal,build --prefix none | grep -E '^(libbpf|rusqlite|libsqlite3|axum)'; then
    echo "error: subc-client depends on the crates above" >&2
    exit 1
fi

log "checking that subc-agent carries no store, service or P4 code to the hosts"
# A host runs the data plane only (ARCHITECTURE.md, crates/agent).
if cargo tree -p subc-agent --locked -e normal,build --prefix none | grep -E '^(rusqlite|libsqlite3|subc-server|subc-p4runtime|subc-backend-p4|prometheus-client) '; then
    echo "error: subc-agent depends on the crates above" >&2
    exit 1
fi

log "checking that subc-backend-p4 is pure generation: no tonic, tokio or rustls"
# Talking to a switch is subc-p4runtime's (ARCHITECTURE.md, crates/backend-p4).
if cargo tree -p subc-backend-p4 --locked -e normal --prefix none | grep -E '^(tonic|tokio|rustls)'; then
    echo "error: subc-backend-p4 depends on the crates above" >&2
    exit 1
fi

# One build per run: incremental data would only fill the disk (3.9 GB of a
# fresh clone's 12 GB target; CI's disk ran out building on 2026-11-29).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

log "linting (clippy, warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

log "building"
cargo build --workspace --all-targets --locked
# The fuzz target is not a workspace member (cargo-fuzz wants nightly to run
# it); type-checking it on stable keeps it compiling. README: "Fuzzing".
cargo check --manifest-path fuzz/Cargo.toml --locked --quiet

log "testing the workspace"
cargo test --workspace --locked

# At scale: 100,000 Siena filters through gRPC in requests of 10,000 to an
# eBPF target, then 1,000 removed and added at random, packets checked
# through the live program; and 10,000 under a P4 table budget. In the test
# build: the IR and the language are optimized in it (Cargo.toml). With
# --workspace, as above: `-p subc-server` resolves other features and
# rebuilt the server's dependencies (4 min 10 s).
log "testing at scale: the service with 100,000 and 10,000 Siena filters"
SUBC_LOWERING_SCALE=100000 cargo test --workspace --locked --test lowering an_ebpf_target_runs_the_group_through_random_changes
cargo test --workspace --locked --test budget -- --ignored ten_thousand_siena_filters_fit_a_budget_of_twenty_thousand

log "all tests passed"
