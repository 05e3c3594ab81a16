#!/bin/bash
# tests/soak/api-load.sh — the API load figure at full length: 64 clients listing incidents
# and paging samples for 60 s (or --seconds N) against the real daemon with an incident
# open, capture armed and a pwru stand-in running, with the strict 20 ms bound on how much
# later the clients make intervals (CI runs the same test for 10 s with a loose bound).
# Then the SIGKILL part of the same test. Measures what users run: the release build (built
# here), the daemon at the priority packaging/tailtrap.service gives it (Nice=-5; its API
# threads lower themselves to nice 10). Needs root.
#   tests/soak/api-load.sh [--seconds N]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
secs=60
while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) secs=${2:?--seconds needs a number}; shift 2 ;;
        -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
        *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$secs" in ''|*[!0-9]*) echo "--seconds must be a number" >&2; exit 2 ;; esac
cd "$ROOT"
cargo build -q --release -p tailtrap --bin tailtrap
bin=${CARGO_TARGET_DIR:-$ROOT/target}/release/tailtrap
# The daemon as the unit runs it; `nice` execs, so the test's pid is the daemon's.
wrap=$(mktemp -d /tmp/tailtrap-api-load-XXXXXX)
trap 'rm -rf "$wrap"' EXIT
printf '#!/bin/sh\nexec nice -n -5 %q "$@"\n' "$bin" >"$wrap/tailtrap"
chmod 755 "$wrap/tailtrap"
TAILTRAP_BIN=$wrap/tailtrap TAILTRAP_LOAD_SECS=$secs TAILTRAP_LOAD_STRICT=1 \
    cargo test -q --release -p tailtrap-tests --test faults \
    api_load -- --include-ignored --nocapture 2>&1 |
    grep -E '^(api load|after SIGKILL|restart|incident)|panicked|test result|an interval was'
