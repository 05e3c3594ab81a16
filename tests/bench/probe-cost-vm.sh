#!/bin/bash
# probe-cost-vm.sh [--kernel SERIES]... [-- BENCH_ENV...]
#
# Runs bpf's probe_cost benchmark (fentry/fexit) on the stock Debian kernels under qemu, the
# way tests/vm/run-vm-tests.sh runs the integration tests: the bench is built once on the
# host, then each kernel boots with the host root shared read-only and runs the executable.
# Slow under software emulation (a few minutes per kernel), so it is not part of CI.
#
# Options:
#   --kernel SERIES   6.1 or 6.12 (repeatable; default both)
# Environment:
#   TAILTRAP_BENCH_SECS   seconds per phase and attach order (default 3; emulation makes the
#                         absolute ns meaningless, the probe ÷ floor ratios are what counts)
#   CARGO_TARGET_DIR, TAILTRAP_VMTEST_CACHE, VM_MEM, VM_CPUS as for run-vm-tests.sh
# Output: the bench's table per kernel; logs in <target dir>/bench-logs/<release>/probe_cost.log

set -uo pipefail
PROG=${0##*/}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
VM=$ROOT/tests/vm
die() { echo "$PROG: $*" >&2; exit 2; }

series=()
while [ $# -gt 0 ]; do
    case $1 in
        --kernel) [ $# -ge 2 ] || die "--kernel needs a value"; series+=("$2"); shift 2 ;;
        *) die "unknown argument '$1' (see the header of $0)" ;;
    esac
done
[ ${#series[@]} -gt 0 ] || series=(6.1 6.12)
for s in "${series[@]}"; do
    case $s in 6.1|6.12) ;; *) die "unknown kernel series '$s' (6.1 or 6.12)" ;; esac
done

declare -A KDIR KVER
while read -r s kver dir; do KDIR[$s]=$dir; KVER[$s]=$kver; done < <("$VM/fetch-kernels.sh") ||
    die "fetching the kernels failed"

cd "$ROOT" || die "cannot enter $ROOT"
echo "$PROG: building the bench (cargo bench -p bpf --bench probe_cost --no-run)" >&2
exe=$(cargo bench -p bpf --bench probe_cost --no-run --message-format=json |
    grep '"reason":"compiler-artifact"' | grep -o '"executable":"[^"]*probe_cost[^"]*"' |
    sed 's/^"executable":"//; s/"$//' | tail -1)
[ -n "$exe" ] && [ -x "$exe" ] || die "cargo reported no probe_cost executable"
target_dir=$(cargo metadata --format-version 1 --no-deps | grep -o '"target_directory":"[^"]*"' | sed 's/.*:"//; s/"$//')

export TAILTRAP_BENCH_SECS=${TAILTRAP_BENCH_SECS:-3}
export VM_ENV="TAILTRAP_BENCH_SECS"
export VM_TIMEOUT=${VM_TIMEOUT:-1800}
bad=0
for s in "${series[@]}"; do
    log=$target_dir/bench-logs/${KVER[$s]}/probe_cost.log
    mkdir -p "$(dirname "$log")"
    echo "==== kernel ${KVER[$s]}: probe_cost" >&2
    "$VM/run-in-vm.sh" "${KDIR[$s]}" -- "$exe" 2>&1 | tee "$log"
    [ "${PIPESTATUS[0]}" = 0 ] || { echo "$PROG: probe_cost failed on ${KVER[$s]}" >&2; bad=1; }
done
exit $bad
