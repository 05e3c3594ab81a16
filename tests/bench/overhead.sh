#!/bin/bash
# overhead.sh [--quick] [--runs N] [--secs S] [--tailtrap PATH] [--vm SERIES] [--stress] [--no-pin]
#             [--floors]
#
# What tailtrap costs a real server: nginx on loopback serving 1 kB and 10 kB files, wrk with
# 10 and 100 connections, N runs of S seconds per configuration, the configurations
# interleaved within each run (run r starts at the r-th of them and goes round, so no
# configuration always comes first or last):
#   none     no tracing
#   daemon   `tailtrap run` with its defaults and nginx's port as a service (capture disarmed;
#            the flight recorder comes on once baselines exist)
#   receive  `daemon` with the send side off (`[probes.enable]` send-to-qdisc,
#            qdisc-sojourn and driver-to-completion false): the receive probes alone, to set the send side's cost
#            beside it
#   armed    the same with capture armed on nginx's service: a static SLO that is always
#            exceeded opens an incident, capture threshold 1us, so records flow at the default
#            rate limit (2000/s) for the whole run
#   hist     `tailtrap hist` alone (probes and histograms, no detector, no capture)
# and with --floors two more, the probe-cost bench's reference programs on the same hooks
# (bpf/examples/reference_programs.rs), no tailtrap:
#   floor    empty programs: what any tool pays for being called at these hooks
#   clock    programs that only read the stamp and the clock: what any latency probe pays
# Reports req/s and wrk's p50/p99/p99.9 per configuration as ratios to "none" of the same run
# (median and min-max over runs), and the BPF programs' CPU share (sum of run_time_ns over
# wall time, kernel.bpf_stats_enabled on) per program.
#
# Root. Installs nginx, wrk, bpftool and stress-ng from Debian when missing. A bench, not a
# test: nothing is asserted.
#
# Options:
#   --quick          1 run of 5 s per configuration (checks the script works)
#   --runs N         runs per configuration (default 3)
#   --secs S         seconds per wrk run (default 30)
#   --tailtrap PATH  the binary (default <target dir>/release/tailtrap, built when missing)
#   --vm SERIES      run the whole bench in a stock Debian kernel under qemu (6.1 or 6.12,
#                    fentry) via tests/vm/run-in-vm.sh; the guest sees the host's root, so the
#                    host's nginx and wrk are the guest's. Emulation makes absolute figures
#                    meaningless; the ratios are what counts.
#   --stress         run `stress-ng --cpu 1` alongside (CPU contention for every configuration)
#   --no-pin         let the scheduler place nginx and wrk. By default, with 2 or more CPUs,
#                    nginx's worker runs on CPU 1 and wrk (one thread) on CPU 0: unpinned, on
#                    2 CPUs, where the three threads land changes from run to run, and
#                    "none" alone moved by up to a third between 30 s runs on an idle host.
#   --floors         add the floor and clock configurations (above): how much of tailtrap's
#                    loss any probe on these hooks would cause on this machine
# Environment: CARGO_TARGET_DIR; VM_MEM, VM_CPUS, VM_TIMEOUT for --vm.
# Output: the tables on stdout; raw per-run figures in $OUT (default /tmp/tailtrap-overhead).

set -uo pipefail
PROG=${0##*/}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
die() { echo "$PROG: $*" >&2; exit 2; }
say() { echo "$PROG: $*" >&2; }

RUNS=3; SECS=30; TAILTRAP=; VMSERIES=; STRESS=0; PIN=1; FLOORS=0
args=("$@")
while [ $# -gt 0 ]; do
    case $1 in
        --quick) RUNS=1; SECS=5; shift ;;
        --runs) [ $# -ge 2 ] || die "--runs needs a value"; RUNS=$2; shift 2 ;;
        --secs) [ $# -ge 2 ] || die "--secs needs a value"; SECS=$2; shift 2 ;;
        --tailtrap) [ $# -ge 2 ] || die "--tailtrap needs a value"; TAILTRAP=$2; shift 2 ;;
        --vm) [ $# -ge 2 ] || die "--vm needs a value"; VMSERIES=$2; shift 2 ;;
        --stress) STRESS=1; shift ;;
        --no-pin) PIN=0; shift ;;
        --floors) FLOORS=1; shift ;;
        *) die "unknown argument '$1' (see the header of $0)" ;;
    esac
done
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || die "--runs must be a positive integer, not '$RUNS'"
CONFIGS=(none daemon receive armed hist)
[ $FLOORS = 1 ] && CONFIGS+=(floor clock)
[[ $SECS =~ ^[1-9][0-9]*$ ]] || die "--secs must be a positive integer, not '$SECS'"
[ "$(id -u)" = 0 ] || die "needs root (BPF, nginx on a port, installing packages)"

# ---- tools
need=()
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || need+=(nginx)
command -v wrk >/dev/null || need+=(wrk)
command -v bpftool >/dev/null || [ -x /usr/sbin/bpftool ] || need+=(bpftool)
command -v stress-ng >/dev/null || need+=(stress-ng)
if [ ${#need[@]} -gt 0 ]; then
    say "installing ${need[*]} from Debian"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >&2 ||
        die "apt-get install ${need[*]} failed"
fi
export PATH=$PATH:/usr/sbin:/sbin
if [ -z "$TAILTRAP" ]; then
    target=${CARGO_TARGET_DIR:-$ROOT/target}
    TAILTRAP=$target/release/tailtrap
    if [ -z "$VMSERIES" ] || [ ! -x "$TAILTRAP" ]; then
        say "building tailtrap (cargo build --release -p tailtrap)"
        (cd "$ROOT" && cargo build --release -p tailtrap >&2) || die "building tailtrap failed"
    fi
fi
[ -x "$TAILTRAP" ] || die "no tailtrap binary at $TAILTRAP"
TAILTRAP=$(readlink -f "$TAILTRAP")
# The reference programs for --floors, built beside the default binary (also for a guest,
# which sees the host's files).
REFERENCE=${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/reference_programs
if [ $FLOORS = 1 ] && { [ -z "$VMSERIES" ] || [ ! -x "$REFERENCE" ]; }; then
    say "building the reference programs (cargo build --release -p bpf --example reference_programs)"
    (cd "$ROOT" && cargo build --release -p bpf --example reference_programs >&2) ||
        die "building the reference programs failed"
fi

# ---- in a guest: the same script, same options, without --vm
if [ -n "$VMSERIES" ]; then
    case $VMSERIES in 6.1|6.12) ;; *) die "unknown kernel series '$VMSERIES' (6.1 or 6.12)" ;; esac
    declare -A KDIR
    while read -r s _ dir; do KDIR[$s]=$dir; done < <("$ROOT/tests/vm/fetch-kernels.sh") ||
        die "fetching the kernels failed"
    inner=(); skip=0
    for a in "${args[@]}"; do
        if [ $skip = 1 ]; then skip=0; continue; fi
        case $a in --vm|--tailtrap) skip=1; continue ;; esac
        inner+=("$a")
    done
    export VM_TIMEOUT=${VM_TIMEOUT:-$(( RUNS * 4 * ${#CONFIGS[@]} * (SECS + 15) + 600 ))}
    # The guest's writes land in a discarded tmpfs: share $OUT read-write so the raw
    # figures outlive the guest.
    OUT=${OUT:-/tmp/tailtrap-overhead}; mkdir -p "$OUT" || die "cannot create $OUT"
    export OUT VM_ENV="${VM_ENV:+$VM_ENV }OUT"
    export VM_RW="${VM_RW:+$VM_RW }$(readlink -f "$OUT")"
    say "running in ${KDIR[$VMSERIES]} (timeout ${VM_TIMEOUT}s)"
    exec "$ROOT/tests/vm/run-in-vm.sh" "${KDIR[$VMSERIES]}" -- "$0" --tailtrap "$TAILTRAP" "${inner[@]}"
fi

# ---- scratch, nginx
OUT=${OUT:-/tmp/tailtrap-overhead}
WORK=$(mktemp -d /tmp/tailtrap-overhead.XXXXXX) || die "mktemp failed"
mkdir -p "$OUT" "$WORK/www" "$WORK/logs"
# mktemp -d makes a 0700 directory, which nginx's unprivileged worker cannot enter: every
# request would be a 403 and the bench would time error pages, not the files.
chmod 755 "$WORK" "$WORK/www"
PORT=18080
head -c 1024 /dev/urandom > "$WORK/www/1k.bin"
head -c 10240 /dev/urandom > "$WORK/www/10k.bin"
chmod 644 "$WORK/www/1k.bin" "$WORK/www/10k.bin"
# Pinning: nginx's worker on CPU 1, wrk on CPU 0 (see --no-pin).
[ "$(nproc)" -ge 2 ] || PIN=0
if [ $PIN = 1 ]; then
    NGINX_AFFINITY="worker_cpu_affinity 10;"; WRK=(taskset -c 0 wrk -t 1); WRK_DESC="wrk -t1 on CPU 0, nginx on CPU 1"
else
    NGINX_AFFINITY=""; WRK=(wrk -t 2); WRK_DESC="wrk -t2, unpinned"
fi
cat > "$WORK/nginx.conf" <<EOF
worker_processes 1;
$NGINX_AFFINITY
pid $WORK/nginx.pid;
error_log $WORK/logs/error.log;
events { worker_connections 1024; }
http {
    access_log off;
    sendfile on;
    keepalive_requests 1000000;
    client_body_temp_path $WORK/body;
    proxy_temp_path $WORK/proxy;
    fastcgi_temp_path $WORK/fastcgi;
    uwsgi_temp_path $WORK/uwsgi;
    scgi_temp_path $WORK/scgi;
    server {
        listen 127.0.0.1:$PORT;
        root $WORK/www;
    }
}
EOF
cat > "$WORK/report.lua" <<'EOF'
done = function(summary, latency, requests)
    io.write(string.format("TT rps=%.1f p50=%d p99=%d p999=%d errors=%d bad_status=%d\n",
        summary.requests / (summary.duration / 1e6),
        latency:percentile(50), latency:percentile(99), latency:percentile(99.9),
        summary.errors.connect + summary.errors.read + summary.errors.write +
        summary.errors.timeout, summary.errors.status))
end
EOF

PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    [ -f "$WORK/nginx.pid" ] && nginx -c "$WORK/nginx.conf" -s stop 2>/dev/null
    [ -n "${STATS_BEFORE:-}" ] && sysctl -q -w kernel.bpf_stats_enabled="$STATS_BEFORE"
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

nginx -c "$WORK/nginx.conf" || die "nginx did not start (see $WORK/logs/error.log)"
# Each file must come back whole with a 200 before anything is timed.
for f in 1k:1024 10k:10240; do
    python3 - "$PORT" "${f%%:*}" "${f##*:}" <<'PY' || die "nginx does not serve ${f%%:*}.bin (see $WORK/logs/error.log)"
import sys, urllib.request
port, name, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
with urllib.request.urlopen(f"http://127.0.0.1:{port}/{name}.bin", timeout=5) as r:
    body = r.read()
    sys.exit(0 if r.status == 200 and len(body) == size else 1)
PY
done
STATS_BEFORE=$(sysctl -n kernel.bpf_stats_enabled)
sysctl -q -w kernel.bpf_stats_enabled=1 || die "cannot enable kernel.bpf_stats_enabled"
if [ $STRESS = 1 ]; then
    stress-ng --cpu 1 --quiet & PIDS+=($!)
fi

# ---- tailtrap configurations
config() { # name extra-toml
    cat > "$WORK/$1.toml" <<EOF
[daemon]
interval = "1s"
db = "$WORK/db-$1"
[api]
socket = "$WORK/api-$1.sock"
[metrics]
listen = "127.0.0.1:0"
[pwru]
enabled = false
$2
[[services]]
name = "nginx"
ports = [$PORT]
EOF
}
config daemon ""
config receive '[probes.enable]
send-to-qdisc = false
qdisc-sojourn = false
driver-to-completion = false'
config armed '[capture]
threshold = "1us"
max_time = "1h"
max_samples = 1000000000
[detector]
max_incident = "1h"
[[detector.slo]]
service = "nginx"
probe = "tcp-socket-read"
quantile = 0.5
max = "1us"'
config hist ""

TT_PID=
start_config() { # name
    TT_PID=
    case $1 in
        none) return 0 ;;
        hist) "$TAILTRAP" hist --config "$WORK/hist.toml" --json > /dev/null 2>"$WORK/logs/hist.log" &
              TT_PID=$!; sleep 3 ;;
        floor|clock)
            "$REFERENCE" "$1" > "$WORK/logs/$1.out" 2>&1 & TT_PID=$!
            for _ in $(seq 150); do
                grep -q '^attached' "$WORK/logs/$1.out" && break
                kill -0 $TT_PID 2>/dev/null || { say "reference programs exited: $(cat "$WORK/logs/$1.out")"; return 1; }
                sleep 0.2
            done ;;
        daemon|receive|armed)
            "$TAILTRAP" run --config "$WORK/$1.toml" 2>"$WORK/logs/$1.log" & TT_PID=$!
            for _ in $(seq 150); do
                "$TAILTRAP" status --config "$WORK/$1.toml" --json >/dev/null 2>&1 && break
                kill -0 $TT_PID 2>/dev/null || { say "tailtrap run exited; see below"; tail -5 "$WORK/logs/$1.log" >&2; return 1; }
                sleep 0.2
            done ;;
    esac
    PIDS+=($TT_PID)
    return 0
}
stop_config() {
    [ -n "$TT_PID" ] || return 0
    kill -TERM "$TT_PID" 2>/dev/null; wait "$TT_PID" 2>/dev/null; TT_PID=
}
# tailtrap's BPF programs: "name run_time_ns run_cnt" per line.
bpf_times() {
    bpftool prog show --json 2>/dev/null | python3 -c '
import json, sys
progs = json.load(sys.stdin)
names = ("ip_start", "tcp_start", "udp_start", "socket_enqueued", "tcp_socket", "udp_socket",
         "send_", "qdisc_sojourn", "floor_", "clock_")
for p in progs:
    n = p.get("name", "")
    if n.startswith(names):
        print(n, p.get("run_time_ns", 0), p.get("run_cnt", 0))'
}

RESULTS=$OUT/runs.tsv
BPF=$OUT/bpf.tsv
printf 'size\tconns\trun\tconfig\trps\tp50_us\tp99_us\tp999_us\terrors\n' > "$RESULTS"
printf 'size\tconns\trun\tconfig\tprogram\trun_time_ns\trun_cnt\twall_ns\n' > "$BPF"
kernel=$(uname -r)
# Programs of another tailtrap (a running daemon, a soak) run in every configuration and
# would be counted in its CPU share: say so, in the log and in the tables.
ALREADY=$(bpf_times | wc -l)
[ "$ALREADY" = 0 ] || say "warning: $ALREADY tailtrap BPF programs were already attached (another daemon?): every configuration pays for them and the CPU shares include them"
total=$(( 2 * 2 * RUNS * ${#CONFIGS[@]} )); n=0
say "kernel $kernel: $total wrk runs of ${SECS}s (about $(( total * (SECS + 6) / 60 )) min)"
for size in 1k 10k; do
    for conns in 10 100; do
        for run in $(seq "$RUNS"); do
            k=$(( (run - 1) % ${#CONFIGS[@]} ))
            for cfg in "${CONFIGS[@]:k}" "${CONFIGS[@]:0:k}"; do
                n=$((n + 1))
                start_config $cfg || die "$cfg did not start"
                # Warm-up under load: the daemon's first intervals, nginx's caches.
                "${WRK[@]}" -c "$conns" -d 3 "http://127.0.0.1:$PORT/$size.bin" >/dev/null 2>&1
                bpf_times > "$WORK/before"
                t0=$(date +%s%N)
                line=$("${WRK[@]}" -c "$conns" -d "$SECS" -s "$WORK/report.lua" "http://127.0.0.1:$PORT/$size.bin" 2>&1 | grep '^TT ')
                t1=$(date +%s%N)
                bpf_times > "$WORK/after"
                if [ $cfg = armed ]; then
                    emitted=$("$TAILTRAP" status --config "$WORK/armed.toml" --json 2>/dev/null |
                        python3 -c 'import json,sys; c=json.load(sys.stdin)["capture"]; print(",".join(c.get("armed",[])) or "-", c["counters"].get("emitted",0))' 2>/dev/null)
                    say "  armed: services, records emitted since start: ${emitted:-unknown}"
                fi
                stop_config
                [ -n "$line" ] || die "wrk printed no result for $cfg $size $conns"
                eval "$(sed 's/^TT //' <<<"$line")"
                # A non-2xx answer means nginx served something else than the file: the
                # figures would not be what the bench says they are.
                [ "$bad_status" = 0 ] ||
                    die "$cfg $size c=$conns: $bad_status of the responses were not 2xx (see $WORK/logs/error.log)"
                printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$size" "$conns" "$run" "$cfg" \
                    "$rps" "$p50" "$p99" "$p999" "$errors" >> "$RESULTS"
                # Files, not <(...): a guest's /dev may have no /dev/fd.
                sort "$WORK/before" > "$WORK/before.sorted"; sort "$WORK/after" > "$WORK/after.sorted"
                join "$WORK/before.sorted" "$WORK/after.sorted" | while read -r prog t0b c0 t1b c1; do
                    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$size" "$conns" "$run" "$cfg" "$prog" \
                        $((t1b - t0b)) $((c1 - c0)) $((t1 - t0)) >> "$BPF"
                done
                say "[$n/$total] $size c=$conns run $run $cfg: $rps req/s p50 ${p50}us p99 ${p99}us p99.9 ${p999}us"
            done
        done
    done
done

# ---- tables
python3 - "$RESULTS" "$BPF" "$kernel" "$RUNS" "$SECS" "$WRK_DESC" "$ALREADY" <<'EOF'
import csv, statistics, sys
from collections import defaultdict
results, bpf, kernel, runs, secs, wrk_desc, already = sys.argv[1:8]
rows = list(csv.DictReader(open(results), delimiter="\t"))
by = {(r["size"], r["conns"], r["run"], r["config"]): r for r in rows}
configs = [c for c in ("daemon", "receive", "armed", "hist", "floor", "clock") if any(r["config"] == c for r in rows)]
print(f"tailtrap overhead: kernel {kernel}, nginx on loopback, {wrk_desc}, {runs} run(s) x {secs} s")
print("ratios to 'none' of the same run: median [min-max]; req/s below 1 is a loss, latency above 1 an inflation")
if already != "0":
    print(f"warning: {already} tailtrap BPF programs of another process ran throughout: these figures are not tailtrap's alone")
print()
print(f"{'file':<5} {'conns':>5} {'config':<7} {'req/s (none)':>13} {'req/s':>20} {'p50':>20} {'p99':>20} {'p99.9':>20}")
def cell(vals):
    if not vals:
        return "-"
    return f"{statistics.median(vals):.3f} [{min(vals):.3f}-{max(vals):.3f}]"
for size in ("1k", "10k"):
    for conns in ("10", "100"):
        runs_here = sorted({r["run"] for r in rows if r["size"] == size and r["conns"] == conns})
        base = [float(by[(size, conns, n, "none")]["rps"]) for n in runs_here if (size, conns, n, "none") in by]
        for cfg in configs:
            ratios = defaultdict(list)
            for n in runs_here:
                b, c = by.get((size, conns, n, "none")), by.get((size, conns, n, cfg))
                if not b or not c:
                    continue
                for k in ("rps", "p50_us", "p99_us", "p999_us"):
                    if float(b[k]) > 0:
                        ratios[k].append(float(c[k]) / float(b[k]))
            none = f"{statistics.median(base):.0f}" if base else "-"
            print(f"{size:<5} {conns:>5} {cfg:<7} {none:>13} {cell(ratios['rps']):>20} {cell(ratios['p50_us']):>20} {cell(ratios['p99_us']):>20} {cell(ratios['p999_us']):>20}")
print()
# One figure per configuration: every (file, conns, run) ratio pooled, as a geometric mean
# with a 95 % interval (normal approximation on the log ratios). The interval is what
# says whether a 1 % target can be judged from this run at all.
import math
print("all files and connection counts pooled: geometric mean of the per-run ratios [95 % interval], n ratios")
print(f"{'config':<7} {'req/s':>24} {'p99':>24} {'n':>4}")
def pooled(vals):
    logs = [math.log(v) for v in vals if v > 0]
    if len(logs) < 2:
        return "-"
    m, se = statistics.mean(logs), statistics.stdev(logs) / math.sqrt(len(logs))
    return f"{math.exp(m):.3f} [{math.exp(m - 1.96 * se):.3f}-{math.exp(m + 1.96 * se):.3f}]"
for cfg in configs:
    rps, p99 = [], []
    for (size, conns, n, c), r in by.items():
        base = by.get((size, conns, n, "none"))
        if c != cfg or not base or float(base["rps"]) <= 0 or float(base["p99_us"]) <= 0:
            continue
        rps.append(float(r["rps"]) / float(base["rps"]))
        p99.append(float(r["p99_us"]) / float(base["p99_us"]))
    print(f"{cfg:<7} {pooled(rps):>24} {pooled(p99):>24} {len(rps):>4}")
print()
b = list(csv.DictReader(open(bpf), delimiter="\t"))
share = defaultdict(list)   # (config, program) -> % of one CPU per run
calls = defaultdict(list)
for r in b:
    wall = int(r["wall_ns"])
    if wall <= 0:
        continue
    share[(r["config"], r["program"])].append(100.0 * int(r["run_time_ns"]) / wall)
    calls[(r["config"], r["program"])].append(int(r["run_cnt"]) / (wall / 1e9))
print("BPF CPU share (run_time_ns over wall time, % of one CPU; mean over all sizes, conns and runs)")
print(f"{'config':<7} {'program':<30} {'% CPU':>8} {'calls/s':>12} {'ns/call':>9}")
for cfg in configs:
    total = 0.0
    for (c, prog) in sorted(k for k in share if k[0] == cfg):
        s = statistics.mean(share[(c, prog)])
        cps = statistics.mean(calls[(c, prog)])
        if cps == 0:
            continue  # a variant not attached on this kernel, or no such traffic
        total += s
        ns = s / 100 * 1e9 / cps if cps > 0 else 0
        print(f"{cfg:<7} {prog:<30} {s:>8.3f} {cps:>12.0f} {ns:>9.1f}")
    print(f"{cfg:<7} {'all programs':<30} {total:>8.3f}")
EOF
say "raw figures: $RESULTS, $BPF"
