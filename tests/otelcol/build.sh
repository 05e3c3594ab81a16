#!/bin/bash
# tests/otelcol/build.sh — builds the tests' OpenTelemetry Collector (main.go beside this
# script: the OTLP receiver and the file exporter, modules pinned by go.mod and go.sum) and
# prints the binary's path on stdout; progress goes to stderr.
#
# The binary is cached as
#   ${TAILTRAP_VMTEST_CACHE:-/var/cache/tailtrap-vmtest}/otelcol/<hash>/otelcol
# where <hash> covers go.mod, go.sum and main.go, so a change to any of them builds anew
# and an unchanged tree reuses the binary without Go or network. A cold build downloads the
# modules from the Go module proxy (GOPROXY) and compiles for a few minutes on 2 cores.
# Concurrent callers (parallel tests) wait for one build under a lock. With --cached-only it
# prints the cached binary's path or fails, and never builds.
#
# Needs Go >= 1.26 (go.mod's go line) on PATH or in /usr/local/go/bin. GOTOOLCHAIN=local:
# an older Go fails here with a message instead of fetching another toolchain.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
say() { printf 'otelcol/build.sh: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

cache=${TAILTRAP_VMTEST_CACHE:-/var/cache/tailtrap-vmtest}/otelcol
hash=$(cat "$here/go.mod" "$here/go.sum" "$here/main.go" | sha256sum | cut -c1-16)
out=$cache/$hash/otelcol
if [ -x "$out" ]; then
    echo "$out"
    exit 0
fi
# --cached-only: the VM guests, where compiling under software emulation would take most of
# an hour, only look.
[ "${1:-}" != --cached-only ] || die "no cached collector at $out (run tests/otelcol/build.sh on the host first)"

# shellcheck source=tests/lib/go_build.sh
. "$here/../lib/go_build.sh"
lock_cache_dir "$cache/$hash"
# Another caller may have finished the build while this one waited for the lock.
if [ -x "$out" ]; then
    echo "$out"
    exit 0
fi

find_go "$here/go.mod" "the tests' OpenTelemetry Collector"

say "building the OpenTelemetry Collector with Go $have into $out (a cold build takes minutes)"
start=$SECONDS
cd "$here"
# -mod=readonly: go.sum must already hold every module, so the build is the one committed;
# -buildvcs=false: no git call (a checkout owned by another user would fail it).
# CGO_ENABLED=0: a static binary that needs no C toolchain and runs in the VM guests too.
CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" "$go" mod download >&2 ||
    die "downloading the collector's Go modules failed (GOPROXY=$("$go" env GOPROXY))"
say "modules ready after $((SECONDS - start)) s; compiling"
tmp=$(mktemp "$cache/$hash/otelcol.XXXXXX")
trap 'rm -f "$tmp"' EXIT
CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" "$go" build -trimpath -ldflags='-s -w' -o "$tmp" . >&2 ||
    die "go build of the OpenTelemetry Collector failed"
chmod 755 "$tmp"
mv "$tmp" "$out"
say "built in $((SECONDS - start)) s ($(du -h "$out" | cut -f1))"
echo "$out"
