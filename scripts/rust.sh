# Sourced by scripts/test.sh and scripts/demo.sh (run from the repository
# root, with `log` defined): the Rust toolchain the workspace needs.
#
#   rust_ok       cargo and rustc are there, at the workspace's rust-version or later
#   install_rust  updates (rustup) or installs (rustup-init) stable when not rust_ok

# The workspace's rust-version, from Cargo.toml.
RUST_MIN="$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)"

rust_ok() {
    command -v cargo >/dev/null && command -v rustc >/dev/null || return 1
    local have
    have="$(rustc --version | cut -d' ' -f2)"
    [ "$(printf '%s\n%s\n' "$RUST_MIN" "$have" | sort -V | head -1)" = "$RUST_MIN" ]
}

install_rust() {
    if rust_ok; then
        return 0
    elif command -v rustup >/dev/null; then
        log "updating Rust (rustup, stable)"
        rustup toolchain install stable --profile minimal && rustup default stable
    else
        log "installing Rust (rustup, stable)"
        curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
        # shellcheck disable=SC1091
        . "$HOME/.cargo/env"
    fi
}

# A rustup installation of an earlier run (sudo does not keep the user's PATH).
if [ -f "$HOME/.cargo/env" ]; then
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
fi
