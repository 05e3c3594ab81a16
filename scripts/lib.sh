# shellcheck shell=bash
# Shared by scripts/run and scripts/test (sourced, not run): root check, apt packages, cargo.

# Minimum Rust release (the workspace's rust-version).
RUST_MIN=1.85
# What building tailtrap needs: a C toolchain, clang for the BPF programs, libelf and zlib for
# the vendored libbpf.
# shellcheck disable=SC2034 # used by the scripts that source this file
BUILD_PACKAGES=(build-essential clang llvm libelf-dev zlib1g-dev pkg-config)

say() { printf '%s: %s\n' "${0##*/}" "$*" >&2; }
fail() { say "$*"; exit 1; }

need_root() {
    [ "$(id -u)" = 0 ] || fail "run me as root: loading BPF programs, namespaces and cgroups need it (sudo $0)"
}

# Installs the given Debian/Ubuntu packages that are not installed yet.
ensure_packages() {
    local missing=() p
    command -v dpkg-query >/dev/null && command -v apt-get >/dev/null ||
        fail "apt-get/dpkg not found: these scripts support Debian 12+ and Ubuntu 22.04+"
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} = 0 ] && return 0
    say "installing ${missing[*]}"
    apt-get update -q >&2 || fail "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2 ||
        fail "apt-get install ${missing[*]} failed"
}

# Puts cargo on PATH (rustup installs it in ~/.cargo/bin, which sudo's PATH may lack) and
# checks its release; explains how to get Rust otherwise.
ensure_cargo() {
    command -v cargo >/dev/null || [ ! -x "$HOME/.cargo/bin/cargo" ] || PATH=$HOME/.cargo/bin:$PATH
    command -v cargo >/dev/null || fail "cargo not found. Install Rust $RUST_MIN or newer with rustup:
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y && . \"\$HOME/.cargo/env\"
(Debian's own cargo package is too old.) Then run $0 again."
    local have
    have=$(cargo --version | awk '{print $2}')
    [ "$(printf '%s\n%s\n' "$RUST_MIN" "$have" | sort -V | head -1)" = "$RUST_MIN" ] ||
        fail "cargo $have is older than $RUST_MIN: run 'rustup update stable' (or install Rust with rustup)"
}
