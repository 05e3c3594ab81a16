#!/bin/bash
# tests/fuzz/run.sh — the long fuzz run: the property tests CI runs with a small case budget
# (every test named fuzz_*), run here with many more cases. Not part of CI. Any user.
#   tests/fuzz/run.sh [--cases N]      (default 20000 cases per property; the stored-records
#                                       property opens a database per case and runs N/100)
# Prints, per property, the cases run, the time and the verdict; exit status 0 only if all
# passed. A failure prints proptest's minimal failing input.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
cases=20000
while [ $# -gt 0 ]; do
    case "$1" in
        --cases) cases=${2:?--cases needs a number}; shift 2 ;;
        -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
        *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$cases" in ''|*[!0-9]*) echo "--cases must be a number, got '$cases'" >&2; exit 2 ;; esac

# crate, cargo selector, case count
runs=(
    "detector|--test fuzz_replay|$cases"
    "capture|--test fuzz_pwru|$cases"
    "capture|--lib|$cases"
    "tailtrap|--bin tailtrap|$cases"
    "storage|--lib|$cases"
    "storage|--test fuzz_records|$(( cases / 100 > 0 ? cases / 100 : 1 ))"
)
echo "building the test executables ..." >&2
for r in "${runs[@]}"; do
    IFS='|' read -r crate sel _ <<<"$r"
    # shellcheck disable=SC2086 # the selector is two words
    cargo test -q -p "$crate" $sel --no-run 2>&1 | grep -v '^$' >&2 || true
done

failed=0
printf '%-10s %-50s %9s %9s  %s\n' crate property cases seconds verdict
for r in "${runs[@]}"; do
    IFS='|' read -r crate sel n <<<"$r"
    # shellcheck disable=SC2086
    names=$(cargo test -q -p "$crate" $sel -- --list fuzz_ 2>/dev/null | sed -n 's/: test$//p')
    for name in $names; do
        start=$(date +%s.%N)
        log=$(mktemp)
        # shellcheck disable=SC2086
        if TAILTRAP_FUZZ_CASES=$n cargo test -q -p "$crate" $sel -- --exact "$name" >"$log" 2>&1; then
            verdict=ok
        else
            verdict=FAILED; failed=$((failed + 1))
        fi
        secs=$(echo "$(date +%s.%N) - $start" | bc)
        printf '%-10s %-50s %9s %9.1f  %s\n' "$crate" "${name##*::}" "$n" "$secs" "$verdict"
        if [ "$verdict" = FAILED ]; then
            grep -E 'minimal failing input|panicked|Test failed' "$log" | head -5 | sed 's/^/    /'
        fi
        rm -f "$log"
    done
done
echo "$failed failed"
[ "$failed" = 0 ]
