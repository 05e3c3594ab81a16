#!/bin/bash
# run-vm-tests.sh [--kernel SERIES]... [--test NAME]... [-- LIBTEST_ARGS...]
#
# Runs the integration tests of the tailtrap-tests crate on stock Debian kernels under qemu,
# where fentry/fexit and kprobes work (the development kernel refuses them).
#   1. fetch-kernels.sh (a no-op when the kernels are cached),
#   2. builds on the host: `cargo build --bins` (the e2e tests run the tailtrap binary) and
#      `cargo test --workspace --no-run`, taking tailtrap-tests' executables from cargo's JSON,
#   3. per kernel and test executable: one VM boot (run-in-vm.sh) running the executable with
#      --test-threads=1 --include-ignored (the guest is root, and the vm_only_* tests are
#      for it) and TAILTRAP_IN_VM=1 TAILTRAP_EXPECT_ATTACH=fentry TAILTRAP_KERNEL=<release>,
#      so a hang or crash affects that executable only.
# Prints a summary per kernel; the last line is "N passed, N failed" over all test cases.
# Exit status 0 only if every executable ran and passed on every kernel.
#
# Options:
#   --kernel SERIES   5.10, 6.1, 6.12 or unstable (repeatable; default all four)
#   --test NAME       only this test executable (file name under tests/tests, no .rs; repeatable)
#   -- ARGS           passed to every test executable (e.g. a name filter)
# Environment:
#   TAILTRAP_VM_TEST_TIMEOUT=1800  seconds per test executable and kernel (pwru_real took
#                                  1091 s on 6.1 beside other builds, 537 s alone)
#   TAILTRAP_REAL_PWRU  the real pwru binary for tests/tests/pwru_real.rs; unset, its
#                       vm_only_real_pwru_* tests are left out (--skip) and the summary says so
#   CARGO_TARGET_DIR, TAILTRAP_VMTEST_CACHE, VM_MEM, VM_CPUS, VM_VERBOSE as usual
# Logs: <target dir>/vmtest-logs/<release>/<test>.log

set -uo pipefail
PROG=${0##*/}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
die() { echo "$PROG: $*" >&2; exit 2; }

series=(); only=(); extra=()
while [ $# -gt 0 ]; do
    case $1 in
        --kernel) [ $# -ge 2 ] || die "--kernel needs a value"; series+=("$2"); shift 2 ;;
        --test) [ $# -ge 2 ] || die "--test needs a value"; only+=("$2"); shift 2 ;;
        --) shift; extra=("$@"); break ;;
        *) die "unknown argument '$1' (see the header of $0)" ;;
    esac
done
[ ${#series[@]} -gt 0 ] || series=(5.10 6.1 6.12 unstable)
for s in "${series[@]}"; do
    case $s in 5.10|6.1|6.12|unstable) ;; *) die "unknown kernel series '$s' (5.10, 6.1, 6.12 or unstable)" ;; esac
done

# ---- kernels
declare -A KDIR KVER
while read -r s kver dir; do KDIR[$s]=$dir; KVER[$s]=$kver; done < <("$HERE/fetch-kernels.sh") ||
    die "fetching the kernels failed"
for s in "${series[@]}"; do [ -n "${KDIR[$s]:-}" ] || die "no kernel for $s"; done

# ---- build on the host, once
cd "$ROOT" || die "cannot enter $ROOT"
echo "$PROG: building (cargo build --bins; cargo test --workspace --no-run)" >&2
cargo build --bins >&2 || die "cargo build --bins failed"
# The same build as `cargo test --workspace` (a -p build would unify features differently and
# rebuild dependencies); only tailtrap-tests' executables run in the VM.
json=$(cargo test --workspace --no-run --message-format=json) || die "building the tests failed"
# Integration test executables of tailtrap-tests: artifacts of target kind "test" in test mode.
mapfile -t executables < <(printf '%s\n' "$json" |
    grep '"reason":"compiler-artifact"' | grep '#tailtrap-tests@' | grep '"kind":\["test"\]' | grep '"test":true' |
    grep -o '"executable":"[^"]*"' | sed 's/^"executable":"//; s/"$//' | sort)
[ ${#executables[@]} -gt 0 ] || die "cargo reported no test executables"
# Host-tier executables: a real Prometheus (not in the guest), scrape timing and interval
# lateness under 64 API clients (meaningless under software emulation), and the
# interval-by-interval replay comparison of tune_daemon (blurred by emulation's late
# intervals), and the allocator settings (user space alone), podman and the image
# (container) and helm (helm_chart), which the guests do not have. They run in scripts/test's
# host step. The Debian package test (package) needs a chroot and the Debian archive, not a
# particular kernel.
HOST_ONLY=(prometheus metrics_endpoint faults tune_daemon churn allocator otlp otelcol_harness container helm_chart package)
tests=()
for exe in "${executables[@]}"; do
    name=$(basename "$exe"); name=${name%-*}   # strip cargo's hash
    host_only=0; for h in "${HOST_ONLY[@]}"; do [ "$h" = "$name" ] && host_only=1; done
    if [ $host_only = 1 ]; then
        echo "run-vm-tests: $name: host tier only, not run in the guests" >&2
        continue
    fi
    if [ ${#only[@]} -gt 0 ]; then
        keep=0; for o in "${only[@]}"; do [ "$o" = "$name" ] && keep=1; done
        [ $keep = 1 ] || continue
    fi
    tests+=("$name=$exe")
done
[ ${#tests[@]} -gt 0 ] || die "no test executable matches ${only[*]}"
target_dir=$(cargo metadata --format-version 1 --no-deps | grep -o '"target_directory":"[^"]*"' | sed 's/.*:"//; s/"$//')

# ---- run
export TAILTRAP_IN_VM=1 TAILTRAP_EXPECT_ATTACH=fentry
export VM_ENV="TAILTRAP_IN_VM TAILTRAP_EXPECT_ATTACH TAILTRAP_KERNEL CARGO_MANIFEST_DIR"
# Single tests of guest executables that only the host tier runs (docs/testing.md,
# "Markers"); they fail in a guest, so they are left out here by name.
#   the_daemon_never_passes_a_function_pwru_ignores (pwru_real): the pwru stand-in in
#     strict mode, whose BTF parse takes minutes under emulation; the guests run the real pwru.
HOST_ONLY_TESTS=(the_daemon_never_passes_a_function_pwru_ignores)
skips=()
for t in "${HOST_ONLY_TESTS[@]}"; do skips+=(--skip "$t"); done
# The real pwru (scripts/test sets it when ../shared/tools/pwru has the binary); the
# guest sees the host's files, so the path works there as it is. Without it the tests that
# need it would fail: they are left out, and the summary says so.
skipped_note=
if [ -n "${TAILTRAP_REAL_PWRU:-}" ]; then
    export TAILTRAP_REAL_PWRU
    VM_ENV="$VM_ENV TAILTRAP_REAL_PWRU"
else
    skips+=(--skip vm_only_real_pwru_)
    for t in "${tests[@]}"; do
        [ "${t%%=*}" = pwru_real ] &&
            skipped_note="skipped: pwru_real's vm_only_real_pwru_* tests (TAILTRAP_REAL_PWRU unset: no real pwru)"
    done
fi
export VM_TIMEOUT=${TAILTRAP_VM_TEST_TIMEOUT:-1800}
export CARGO_MANIFEST_DIR=$ROOT/tests
summary=(); total_pass=0; total_fail=0; bad=0; reruns=0
for s in "${series[@]}"; do
    export TAILTRAP_KERNEL=${KVER[$s]}
    logdir=$target_dir/vmtest-logs/$TAILTRAP_KERNEL
    mkdir -p "$logdir"
    for t in "${tests[@]}"; do
        name=${t%%=*}; exe=${t#*=}
        log=$logdir/$name.log
        echo "==== kernel $TAILTRAP_KERNEL: $name" >&2
        start=$(date +%s)
        # Up to two reruns, said in the summary, when the guest kernel died (run-in-vm.sh
        # status 126: an unhandled int3 at a call site it was patching, a panic while booting
        # or under pwru's kprobes, a CPU stuck in the kernel): an artefact of the guest kernel
        # under software emulation that no test can prevent (a long test that starts and
        # stops daemons patches trampolines many times: causes died in 2 runs of 2 on 6.12
        # once). A third death fails the tier; any other failure stands. A failed run keeps
        # the whole guest console beside its log.
        rerun=""; deaths=0
        for attempt in 1 2 3; do
            rm -f "$log.console"
            # cargo runs integration tests from the package directory; do the same.
            (cd "$ROOT/tests" && VM_CONSOLE_KEEP="$log.console" "$HERE/run-in-vm.sh" "${KDIR[$s]}" -- "$exe" --test-threads=1 --include-ignored "${skips[@]}" "${extra[@]}") 2>&1 |
                tee "$log"
            rc=${PIPESTATUS[0]}
            [ "$rc" = 126 ] && [ "$attempt" -lt 3 ] || break
            deaths=$((deaths + 1))
            cp "$log" "$log.guest-died$deaths"
            [ -e "$log.console" ] && mv "$log.console" "$log.guest-died$deaths.console"
            rerun=" (rerun after the guest kernel died $deaths time(s), logs: $name.log.guest-died*)"
            reruns=$((reruns + 1))
            echo "run-vm-tests: $name on $TAILTRAP_KERNEL: the guest kernel died (int3 oops, panic or lockup); running it again" >&2
        done
        secs=$(( $(date +%s) - start ))
        # libtest's own count: "test result: ok. 8 passed; 0 failed; 1 ignored; ..."
        counts=$(grep -o 'test result: [A-Za-z]*\. [0-9]* passed; [0-9]* failed; [0-9]* ignored' "$log" | tail -1)
        pass=$(sed -n 's/.* \([0-9]*\) passed;.*/\1/p' <<<"$counts"); pass=${pass:-0}
        fail=$(sed -n 's/.* \([0-9]*\) failed;.*/\1/p' <<<"$counts"); fail=${fail:-0}
        ign=$(sed -n 's/.* \([0-9]*\) ignored.*/\1/p' <<<"$counts"); ign=${ign:-0}
        case $rc in
            0) verdict=ok ;;
            124) verdict="TIMEOUT after ${VM_TIMEOUT}s" ;;
            125) verdict="VM FAILED" ;;
            126) verdict="GUEST KERNEL DIED 3 times" ;;
            *) verdict="FAILED (exit $rc)" ;;
        esac
        # A run that died before libtest's summary still counts as one failure.
        [ "$rc" != 0 ] && [ "$fail" = 0 ] && fail=1
        [ "$rc" != 0 ] && bad=1
        total_pass=$((total_pass + pass)); total_fail=$((total_fail + fail))
        summary+=("$(printf '%-22s %-16s %-28s %4ss  %s%s' "$TAILTRAP_KERNEL" "$name" "$verdict" "$secs" \
            "$pass passed, $fail failed, $ign ignored" "$rerun")")
    done
done

echo
echo "VM test summary (logs in $target_dir/vmtest-logs):"
printf '  %s\n' "${summary[@]}"
[ "$reruns" = 0 ] || echo "run-vm-tests: $reruns executable(s) rerun after the guest kernel died (see above)"
[ -z "$skipped_note" ] || echo "run-vm-tests: $skipped_note"
echo "$total_pass passed, $total_fail failed"
exit $bad
