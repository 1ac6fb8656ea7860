#!/usr/bin/env bash
# Generates the Go stubs of the subc API from proto/subc/v1/subc.proto.
#
#   clients/go/generate.sh            # (re)writes subcv1/subc.pb.go and subcv1/subc_grpc.pb.go
#   clients/go/generate.sh --check    # exit 1 when the committed stubs differ from a fresh generation
#
# The stubs are committed so that `go get` needs no code generation;
# scripts/test.sh runs `--check` so the proto and the stubs cannot drift
# apart. The plugins are installed with `go install` at the versions pinned
# here (the generated text depends on them) into
# ${CARGO_TARGET_DIR:-target}/tools/go; protoc is the system's (Debian's
# protobuf-compiler, with the well-known types of libprotobuf-dev). The
# check ignores the header line naming protoc's version, the one thing a
# different protoc changes.
#
# Go: $SUBC_GO, else `go` on PATH, else /usr/local/go/bin/go.
set -euo pipefail

PROTOC_GEN_GO_VERSION=v1.36.12     # google.golang.org/protobuf, as go.mod requires
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2  # google.golang.org/grpc/cmd/protoc-gen-go-grpc

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
MODULE=github.com/subc-dev/subc/clients/go
PROTO=subc/v1/subc.proto
OUTPUTS=(subcv1/subc.pb.go subcv1/subc_grpc.pb.go)

GO="${SUBC_GO:-$(command -v go || echo /usr/local/go/bin/go)}"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
mkdir -p "$TARGET/tools/go"
TOOLS="$(cd "$TARGET/tools/go" && pwd)"
export GOTOOLCHAIN=local GOPATH="$TOOLS" GOMODCACHE="$TOOLS/pkg/mod" GOCACHE="$TOOLS/cache" GOFLAGS=-modcacherw

# `plugin NAME PACKAGE VERSION`: the plugin's path, installed if missing.
plugin() {
    local dir="$TOOLS/$1-$3"
    if [ ! -x "$dir/$1" ]; then
        echo "installing $2@$3 into $dir" >&2
        GOBIN="$dir" "$GO" install "$2@$3"
    fi
    echo "$dir/$1"
}
GEN_GO="$(plugin protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go "$PROTOC_GEN_GO_VERSION")"
GEN_GO_GRPC="$(plugin protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc "$PROTOC_GEN_GO_GRPC_VERSION")"

# `generate DIR`: the stubs under DIR (as DIR/subcv1/...). The proto's
# go_package names a path of its own; M maps it to this module's package.
generate() {
    local map="M$PROTO=$MODULE/subcv1;subcv1"
    protoc -I"$ROOT/proto" \
        --plugin=protoc-gen-go="$GEN_GO" --plugin=protoc-gen-go-grpc="$GEN_GO_GRPC" \
        --go_out="$1" --go_opt="module=$MODULE" --go_opt="$map" \
        --go-grpc_out="$1" --go-grpc_opt="module=$MODULE" --go-grpc_opt="$map" \
        "$ROOT/proto/$PROTO"
}

if [ "${1:-}" != --check ]; then
    generate "$HERE"
    exit 0
fi

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
generate "$TMP"
# The header's protoc version ("// \tprotoc  v3.21.12", "// - protoc  v3.21.12").
without_protoc() { sed -E '/^\/\/ (\t| - )protoc +/d' "$1" 2>/dev/null || true; }
stale=0
for f in "${OUTPUTS[@]}"; do
    if ! cmp -s <(without_protoc "$HERE/$f") <(without_protoc "$TMP/$f"); then
        echo "$f is stale:" >&2
        diff -u --label "committed/$f" --label "fresh/$f" <(without_protoc "$HERE/$f") <(without_protoc "$TMP/$f") | head -40 >&2 || true
        stale=1
    fi
done
if [ "$stale" = 1 ]; then
    echo "run: clients/go/generate.sh" >&2
fi
exit "$stale"
