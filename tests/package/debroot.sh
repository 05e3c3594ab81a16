#!/bin/bash
# tests/package/debroot.sh — prints the path of a tar of a clean Debian bookworm root
# (`debootstrap --variant=minbase`: no compiler, no libelf, no systemd), made once and kept
# as $TAILTRAP_VMTEST_CACHE/debroot-bookworm.tar (default /var/cache/tailtrap-vmtest).
# tests/tests/package.rs unpacks a fresh copy for each test and installs the .deb into it.
# Needs root and, the first time, the Debian archive (TAILTRAP_DEBIAN_MIRROR, default
# http://deb.debian.org/debian). Delete the tar to make it again.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
. "$ROOT/scripts/lib.sh"

cache=${TAILTRAP_VMTEST_CACHE:-/var/cache/tailtrap-vmtest}
tar=$cache/debroot-bookworm.tar
mirror=${TAILTRAP_DEBIAN_MIRROR:-http://deb.debian.org/debian}
mkdir -p "$cache"
# Tests running at the same time wait for one debootstrap instead of each running their own.
exec 9>"$cache/debroot-bookworm.lock"
flock 9
if [ ! -s "$tar" ]; then
    need_root
    command -v debootstrap >/dev/null || ensure_packages debootstrap
    work=$(mktemp -d "$cache/debroot.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    say "debootstrap --variant=minbase bookworm from $mirror (once; cached in $tar)"
    if ! debootstrap --variant=minbase bookworm "$work/root" "$mirror" >"$work/log" 2>&1; then
        tail -n 30 "$work/log" >&2
        fail "debootstrap failed (the end of its output above)"
    fi
    # The downloaded packages are installed already: not worth keeping.
    rm -f "$work"/root/var/cache/apt/archives/*.deb
    tar --numeric-owner -C "$work/root" -cf "$tar.tmp" . && mv "$tar.tmp" "$tar"
fi
echo "$tar"
