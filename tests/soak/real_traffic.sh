#!/bin/bash
# tests/soak/real_traffic.sh — false incidents under real, steady traffic (issue 32 item 7).
# A network namespace behind a veth pair holds two real servers; their clients run on the
# host's side, so every request and every answer crosses the veth:
#   nginx  nginx (Debian's nginx-light) serving a 2 KiB static file, loaded by wrk at a fixed
#          rate (a Lua delay() between the requests of each of 4 keep-alive connections)
#   echo   the repo's TCP echo server (tailtrap-traffic tcp-server), one client at a time
#          sending 100-byte messages with a fixed pause (restarted as each ends)
#   host   what the daemon adds itself: every packet of no declared service (the clients'
#          answers, this script's scrapes of /metrics, the machine's own traffic)
# The real daemon (release build, at the Nice=-5 packaging/tailtrap.service gives it) runs
# with the detector's defaults: its config holds only the services (by port), the database,
# API socket and pwru runtime directory in the output directory, and a free /metrics port.
# No cause is injected. After the baselines are warm (the default warm-up is 10 min;
# --warmup shortens it through detector.warmup_time, and the output says so) it measures
# for --minutes, reading the daemon every --read-every seconds as an operator would:
# `status`, `incidents`, `incidents show` / `export` / `samples` of the newest incident,
# the API over its socket, /metrics, and now and then `history --summary`.
# Prints a line a minute, then a summary: per service the incidents opened in the measured
# span and incidents per service-hour, each incident (opening time, headline, duration,
# cause), the total against the target (at most 1 incident per service-hour), the lines of
# the daemon's log that mention notices, and the machine's load. A measurement, not a test:
# exit 0 whatever the figure, unless setup failed (1) or --max-per-service-hour is given and
# the total rate exceeds it (1). Not part of CI (40 min with the defaults). Needs root.
#   tests/soak/real_traffic.sh [--minutes N]          measured span (default 30)
#                              [--warmup DUR]          detector.warmup_time (default 10m, the
#                                                      built-in default: not written to the config)
#                              [--read-every S]        seconds between operator reads (default 20)
#                              [--rate R]              nginx requests/s wanted (default 400)
#                              [--echo-pause DUR]      pause between echo messages (default 5ms)
#                              [--max-per-service-hour X]  exit 1 when the total rate exceeds X
#                              [--out DIR]             output directory (default: a new
#                                                      /tmp/tailtrap-real-traffic-* directory)
#                              [--bin DIR]             where tailtrap and tailtrap-traffic are
#                                                      (default: the release build)
# Installs nginx-light, wrk, jq and curl with apt-get when missing (and stops the system's
# nginx.service if installing nginx started it). Builds nothing: run
# `cargo build --release --bins` first. Cleans up its namespace, veth and processes on exit.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
minutes=30
warmup=10m
read_every=20
rate=400
echo_pause=5ms
max_rate=""
out=""
bin=""
nginx_port=18080
echo_port=18081
while [ $# -gt 0 ]; do
    case "$1" in
        --minutes) minutes=${2:?--minutes needs a number}; shift 2 ;;
        --warmup) warmup=${2:?--warmup needs a duration}; shift 2 ;;
        --read-every) read_every=${2:?--read-every needs seconds}; shift 2 ;;
        --rate) rate=${2:?--rate needs requests per second}; shift 2 ;;
        --echo-pause) echo_pause=${2:?--echo-pause needs a duration}; shift 2 ;;
        --max-per-service-hour) max_rate=${2:?--max-per-service-hour needs a number}; shift 2 ;;
        --out) out=${2:?--out needs a directory}; shift 2 ;;
        --bin) bin=${2:?--bin needs a directory}; shift 2 ;;
        -h|--help) sed -n '2,38p' "$0"; exit 0 ;;
        *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
for v in "$minutes" "$read_every" "$rate"; do
    case "$v" in ''|*[!0-9]*|0) echo "--minutes, --read-every and --rate must be positive whole numbers" >&2; exit 2 ;; esac
done
case "$max_rate" in ''|[0-9]*) ;; *) echo "--max-per-service-hour must be a number" >&2; exit 2 ;; esac
[ "$(id -u)" = 0 ] || { echo "needs root (BPF, namespaces, veth)" >&2; exit 2; }

die() { echo "real-traffic: setup failed: $*" >&2; exit 1; }

# --- tools -----------------------------------------------------------------------------
need=()
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || need+=(nginx-light)
command -v wrk >/dev/null || need+=(wrk)
command -v jq >/dev/null || need+=(jq)
command -v curl >/dev/null || need+=(curl)
command -v column >/dev/null || need+=(bsdextrautils)
if [ ${#need[@]} -gt 0 ]; then
    nginx_was=inactive
    command -v systemctl >/dev/null && nginx_was=$(systemctl is-active nginx 2>/dev/null)
    echo "installing ${need[*]} (apt-get)" >&2
    for p in "${need[@]}"; do
        apt-cache policy "$p" 2>/dev/null | grep -q 'Candidate: [0-9]' || { apt-get update -qq || true; break; }
    done
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" \
        >/dev/null || die "apt-get install ${need[*]} failed"
    # Debian's nginx package starts nginx.service on port 80: not wanted here.
    if command -v systemctl >/dev/null && [ "$nginx_was" != active ] &&
        [ "$(systemctl is-active nginx 2>/dev/null)" = active ]; then
        systemctl stop nginx && echo "stopped nginx.service, which installing nginx started" >&2
    fi
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

bin=${bin:-${CARGO_TARGET_DIR:-$ROOT/target}/release}
for b in tailtrap tailtrap-traffic; do
    [ -x "$bin/$b" ] || die "$bin/$b missing: run cargo build --release --bins first (or give --bin)"
done
for p in $nginx_port $echo_port; do
    # Services are matched by local port: no socket of the host may use these.
    ss -Htan "( sport = :$p )" | grep -q . && die "port $p is in use on the host"
done

out=${out:-$(mktemp -d /tmp/tailtrap-real-traffic-XXXXXX)}
mkdir -p "$out" || die "cannot create $out"
out=$(cd "$out" && pwd)
# Private copies: a rebuild during the run must not change what runs.
cp "$bin/tailtrap" "$bin/tailtrap-traffic" "$out/" || die "cannot copy the binaries"
tt="$out/tailtrap"
cfg="$out/tailtrap.toml"
log() { echo "$*" | tee -a "$out/run.log"; }

# --- cleanup ---------------------------------------------------------------------------
ns="ttrt-$$"
hif="ttrt$$h"
pif="ttrt$$p"
daemon=""
pids=()   # our own processes (loops, servers), killed by pid
cleanup() {
    touch "$out/stop"
    for p in "${pids[@]}"; do
        pkill -INT -P "$p" 2>/dev/null   # a loop's current client (its child)
        kill "$p" 2>/dev/null
    done
    if [ -n "$daemon" ] && kill -0 "$daemon" 2>/dev/null; then
        kill -TERM "$daemon"
        for _ in $(seq 120); do kill -0 "$daemon" 2>/dev/null || break; sleep 0.5; done
        kill -KILL "$daemon" 2>/dev/null
    fi
    wait 2>/dev/null
    ip netns del "$ns" 2>/dev/null
    ip link del "$hif" 2>/dev/null
    true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- network: a namespace behind a veth ------------------------------------------------
# A /30 of 10.201.0.0/16 (the test helpers use 10.200.0.0/16) not already on the host.
sub=""
for i in $(seq 0 63); do
    n=$(( ($$ + i * 37) % 16384 ))
    cand="10.201.$((n / 64)).$(( (n % 64) * 4 ))"
    ip -4 addr | grep -q "inet 10\.201\.$((n / 64))\.$(( (n % 64) * 4 + 1 ))/" || { sub=$cand; break; }
done
[ -n "$sub" ] || die "no free /30 in 10.201.0.0/16"
base=${sub%.*}; last=${sub##*.}
host_ip="$base.$((last + 1))"
peer_ip="$base.$((last + 2))"
ip netns add "$ns" || die "ip netns add $ns"
ip -n "$ns" link set lo up
ip link add "$hif" type veth peer name "$pif" netns "$ns" || die "ip link add veth"
ip addr add "$host_ip/30" dev "$hif" && ip link set "$hif" up &&
    ip -n "$ns" addr add "$peer_ip/30" dev "$pif" && ip -n "$ns" link set "$pif" up ||
    die "cannot address the veth"

# --- the servers, in the namespace -----------------------------------------------------
mkdir -p "$out/nginx/www" "$out/nginx/tmp"
head -c 2048 /dev/zero | tr '\0' 'x' >"$out/nginx/www/index.html"
cat >"$out/nginx/nginx.conf" <<EOF
daemon off;
master_process on;
worker_processes 1;
user root;
pid $out/nginx/nginx.pid;
error_log $out/nginx/error.log warn;
events { worker_connections 512; }
http {
    access_log off;
    client_body_temp_path $out/nginx/tmp/body;
    proxy_temp_path $out/nginx/tmp/proxy;
    fastcgi_temp_path $out/nginx/tmp/fastcgi;
    uwsgi_temp_path $out/nginx/tmp/uwsgi;
    scgi_temp_path $out/nginx/tmp/scgi;
    server {
        listen $peer_ip:$nginx_port;
        root $out/nginx/www;
    }
}
EOF
ip netns exec "$ns" "$NGINX" -t -q -p "$out/nginx" -e "$out/nginx/error.log" -c "$out/nginx/nginx.conf" ||
    die "nginx -t refused $out/nginx/nginx.conf"
ip netns exec "$ns" "$NGINX" -p "$out/nginx" -e "$out/nginx/error.log" -c "$out/nginx/nginx.conf" &
pids+=($!)
"$out/tailtrap-traffic" tcp-server --bind "$peer_ip:$echo_port" --netns "/run/netns/$ns" \
    >"$out/echo-server.out" 2>&1 &
pids+=($!)
for _ in $(seq 50); do
    curl -sf -o /dev/null "http://$peer_ip:$nginx_port/" && [ -s "$out/echo-server.out" ] && break
    sleep 0.2
done
curl -sf -o /dev/null "http://$peer_ip:$nginx_port/" || die "nginx does not answer: $(tail -5 "$out/nginx/error.log")"
[ -s "$out/echo-server.out" ] || die "the echo server did not start: $(cat "$out/echo-server.out")"

# --- the daemon --------------------------------------------------------------------------
mport=""
for p in $(seq 10436 10535); do
    ss -Htan "( sport = :$p )" | grep -q . || { mport=$p; break; }
done
[ -n "$mport" ] || die "no free port for /metrics in 10436-10535"
warm_line=""
[ "$warmup" != 10m ] && warm_line="[detector]
warmup_time = \"$warmup\"    # shortened by --warmup; every other detector key at its default"
cat >"$cfg" <<EOF
# Detector defaults; only what keeps this run apart from any other daemon on the host.
[daemon]
db = "$out/db"

[api]
socket = "$out/api.sock"

[metrics]
listen = "127.0.0.1:$mport"

[pwru]
runtime_dir = "$out/run"

[[services]]
name = "nginx"
ports = [$nginx_port]

[[services]]
name = "echo"
ports = [$echo_port]

$warm_line
EOF
"$tt" config check "$cfg" >/dev/null || die "tailtrap config check $cfg"
RUST_LOG=${REAL_TRAFFIC_RUST_LOG:-info} nice -n -5 "$tt" run --config "$cfg" 2>"$out/daemon.log" &
daemon=$!
for _ in $(seq 300); do
    "$tt" -v status --json --config "$cfg" 2>&1 >/dev/null | grep -q "daemon's API" && break
    kill -0 "$daemon" 2>/dev/null || die "the daemon exited: $(tail -5 "$out/daemon.log")"
    sleep 0.2
done

# --- steady traffic, from the host's side --------------------------------------------------
conns=4
delay_ms=$(( conns * 1000 / rate ))
(( delay_ms >= 1 )) || die "--rate $rate is above what 4 connections with a 1 ms delay give"
cat >"$out/wrk.lua" <<EOF
-- A fixed pause before each request of a connection: $conns connections, ~$rate requests/s.
function delay() return $delay_ms end
EOF
(
    while [ ! -e "$out/stop" ]; do
        wrk -t1 -c"$conns" -d3600s --timeout 10s -s "$out/wrk.lua" \
            "http://$peer_ip:$nginx_port/index.html" >>"$out/wrk.out" 2>&1
        echo "wrk exited $?" >>"$out/wrk.out"
        sleep 1
    done
) &
pids+=($!)
(
    while [ ! -e "$out/stop" ]; do
        "$out/tailtrap-traffic" tcp-client --target "$peer_ip:$echo_port" --messages 1000000 \
            --size 100 --pause "$echo_pause" --deadline 600s >>"$out/echo-client.out" 2>&1 || sleep 1
    done
) &
pids+=($!)

warm_note="the default 10m"
[ "$warmup" != 10m ] && warm_note="$warmup (SHORTENED from the default 10m through detector.warmup_time)"
log "real traffic: veth $hif <-> $ns:$pif ($host_ip -> $peer_ip); nginx :$nginx_port (wrk, $conns connections, ~$rate req/s), echo :$echo_port (pause $echo_pause)"
log "daemon pid $daemon, detector defaults, warm-up $warm_note; output in $out"

# --- warm-up ----------------------------------------------------------------------------------
# Ready when every (service, probe) seen of nginx and echo is warm, and host's
# tcp-socket-read (the clients' answers). host's other keys carry the machine's own sparse
# traffic (a little UDP, say), which may take far longer to reach warmup_samples: they are
# listed, not waited for; an incident cannot open on a key before it is warm.
services=(nginx echo host)
declare -A keywarm=()
start_s=$(date +%s)
limit_s=$(( start_s + 15 * 60 ))
case "$warmup" in *m) limit_s=$(( start_s + ${warmup%m} * 60 + 5 * 60 )) ;; esac
last_min=0
while :; do
    kill -0 "$daemon" 2>/dev/null || die "the daemon died during the warm-up; log: $out/daemon.log"
    st=$("$tt" status --json --config "$cfg" 2>/dev/null)
    while read -r key w; do
        [ -n "$key" ] && keywarm[$key]=$w
    done < <(jq -r '.latency[]? | select(.count > 0) | "\(.service)/\(.probe) \(if .baseline_p99_ns == null then 0 else 1 end)"' <<<"$st")
    ready=1
    summary=""
    for s in "${services[@]}"; do
        total=0; warmn=0
        for k in "${!keywarm[@]}"; do
            [ "${k%%/*}" = "$s" ] || continue
            total=$((total + 1)); warmn=$((warmn + keywarm[$k]))
        done
        summary+=" $s $warmn/$total"
        [ "${keywarm[$s/tcp-socket-read]:-0}" = 1 ] || ready=0
        [ "$s" = host ] || (( warmn == total )) || ready=0
    done
    now_s=$(date +%s)
    cold=""
    for k in "${!keywarm[@]}"; do [ "${keywarm[$k]}" = 1 ] || cold+=" $k"; done
    if (( ready )); then
        log "warm after $(( (now_s - start_s) / 60 ))m$(( (now_s - start_s) % 60 ))s: keys warm/seen:$summary${cold:+ (still cold:$cold)}"
        break
    fi
    if (( now_s >= limit_s )); then
        log "NOT warm after $(( (now_s - start_s) / 60 )) min (warm/seen:$summary; cold:$cold); measuring anyway: cold keys cannot open incidents"
        break
    fi
    if (( (now_s - start_s) / 60 > last_min )); then
        last_min=$(( (now_s - start_s) / 60 ))
        log "warm-up $(printf '%2d' "$last_min") min: keys warm/seen:$summary"
    fi
    sleep 5
done

# --- the measured span, with an operator's reads ---------------------------------------------
echo "unix_s,command,rc,ms,bytes" >"$out/reads.csv"
echo "elapsed_s,nginx_per_s,echo_per_s,host_per_s,open_incidents,load1" >"$out/series.csv"
reads_ok=0
reads_failed=0
timed() { # name command... : runs it, its stdout counted and discarded, a row in reads.csv
    local name=$1 t0 t1 rc bytes
    shift
    t0=$(date +%s%N)
    "$@" >"$out/.read" 2>>"$out/reads.err"
    rc=$?
    t1=$(date +%s%N)
    bytes=$(stat -c %s "$out/.read")
    echo "$((t1 / 1000000000)),$name,$rc,$(( (t1 - t0) / 1000000 )),$bytes" >>"$out/reads.csv"
    if [ "$rc" = 0 ]; then reads_ok=$((reads_ok + 1)); else reads_failed=$((reads_failed + 1)); fi
}
round=0
read_round() {
    round=$((round + 1))
    timed status "$tt" status --config "$cfg"
    timed incidents "$tt" incidents --since 1h --config "$cfg"
    local newest
    newest=$("$tt" incidents --json --limit 1 --config "$cfg" 2>/dev/null | jq -r '.incidents[0].id // empty')
    if [ -n "$newest" ]; then
        timed show "$tt" incidents show "$newest" --config "$cfg"
        timed export "$tt" export "$newest" --config "$cfg"
        timed samples "$tt" samples "$newest" --limit 50 --config "$cfg"
    fi
    timed api-open curl -sf --unix-socket "$out/api.sock" 'http://tailtrap/v1/incidents?state=open'
    timed metrics curl -sf "http://127.0.0.1:$mport/metrics"
    (( round % 6 == 0 )) && timed history "$tt" history nginx --since 10m --summary --config "$cfg"
    # The rates and open incidents, from the status an operator reads.
    "$tt" status --json --config "$cfg" 2>/dev/null | jq -r --arg e "$(( $(date +%s) - t0_s ))" \
        --arg l "$(cut -d' ' -f1 /proc/loadavg)" \
        'def c(s): [.latency[]? | select(.service == s and .probe == "tcp-socket-read") | .count] | add // 0;
         "\($e),\(c("nginx")),\(c("echo")),\(c("host")),\(.open_incidents | length),\($l)"' \
        >>"$out/series.csv" 2>/dev/null
}
steal_jiffies() { awk '/^cpu / {print $9}' /proc/stat; }
steal0=$(steal_jiffies)
# The machine's CPU time (all but idle and iowait) and each live process's, to say how busy
# the host was and with what.
busy_jiffies() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8 + $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat; }
proc_cpu() { # pid comm utime+stime (jiffies), one line per live process
    for f in /proc/[0-9]*/stat; do cat "$f" 2>/dev/null; echo; done |
        awk 'NF { i = index($0, "("); j = 0; for (k = length($0); k > 0; k--) if (substr($0, k, 1) == ")") { j = k; break }
                  comm = substr($0, i + 1, j - i - 1); gsub(/ /, "_", comm)
                  split(substr($0, j + 2), f, " "); print substr($0, 1, i - 2), comm, f[12] + f[13] }'
}
read -r busy0 all0 < <(busy_jiffies)
proc_cpu >"$out/proc-cpu-start.txt"
t0_ns=$(date +%s%N)
t0_s=$((t0_ns / 1000000000))
t0_stamp=$(date -u -d "@$t0_s" +%Y-%m-%dT%H:%M:%S)
end_s=$(( t0_s + minutes * 60 ))
incident_counts() { # per service, opened at or after t0: "nginx 0, echo 1, host 0 (total 1)"
    "$tt" incidents --json --limit 10000 --config "$cfg" 2>/dev/null | jq -r --argjson t0 "$t0_ns" '
        [.incidents[] | select(.opened_ns >= $t0)] as $m
        | ([ "nginx", "echo", "host" ] | map(. as $s | "\($s) \($m | map(select(.service == $s)) | length)") | join(", "))
          + ", host-wide \($m | map(select(.service == "host-wide")) | length)"
          + " (total \($m | map(select(.service != "host-wide")) | length))"'
}
log "measuring for $minutes min from $(date -u -d "@$t0_s" +%H:%M:%SZ), reading the daemon every ${read_every}s"
minute=0
next_read=$t0_s
while :; do
    now=$(date +%s)
    (( now >= end_s )) && break
    kill -0 "$daemon" 2>/dev/null || die "the daemon died at minute $minute; log: $out/daemon.log"
    if (( now >= next_read )); then
        read_round
        next_read=$(( next_read + read_every ))
    fi
    if (( (now - t0_s) / 60 > minute )); then
        minute=$(( (now - t0_s) / 60 ))
        notices=$(awk -v a="$t0_stamp" 'tolower($0) ~ /notice/ && $1 >= a' "$out/daemon.log" | wc -l)
        log "$(printf '%3d/%d min' "$minute" "$minutes")  incidents: $(incident_counts)  notices: $notices  reads ok $reads_ok, failed $reads_failed  load $(cut -d' ' -f1 /proc/loadavg)"
    fi
    sleep 1
done
end_ns=$(date +%s%N)
log "$(printf '%3d/%d min' "$minutes" "$minutes")  incidents: $(incident_counts)  reads ok $reads_ok, failed $reads_failed  load $(cut -d' ' -f1 /proc/loadavg)"
steal_ms=$(( ($(steal_jiffies) - steal0) * 1000 / $(getconf CLK_TCK) ))
read -r busy1 all1 < <(busy_jiffies)
busy_pct=$(( (busy1 - busy0) * 100 / ((all1 - all0) > 0 ? (all1 - all0) : 1) ))
proc_cpu >"$out/proc-cpu-end.txt"
hz=$(getconf CLK_TCK)
# CPU seconds in the span per command name, for processes alive at its end (those started
# during it counted from zero; those that ended during it, such as compilers, are missed).
top_procs=$(awk -v hz="$hz" 'NR == FNR { start[$1] = $3; next }
        { d = $3 - (($1 in start) ? start[$1] : 0); if (d > 0) cpu[$2] += d }
        END { for (c in cpu) printf "%.1f %s\n", cpu[c] / hz, c }' \
        "$out/proc-cpu-start.txt" "$out/proc-cpu-end.txt" | sort -rn | head -n 6 |
    awk '{ printf "%s%s %ss", (NR > 1 ? ", " : ""), $2, $1 }')

# --- what the daemon holds, read while it runs ------------------------------------------------
"$tt" incidents --json --limit 10000 --config "$cfg" >"$out/incidents.json" 2>>"$out/reads.err" ||
    echo "cannot list the incidents" >&2
"$tt" status --json --config "$cfg" >"$out/status-end.json" 2>>"$out/reads.err"
mkdir -p "$out/exports"
for id in $(jq -r '.incidents[].id' "$out/incidents.json" 2>/dev/null | head -n 100); do
    "$tt" export "$id" --config "$cfg" >"$out/exports/$id.json" 2>>"$out/reads.err"
done

# Stop the traffic and the daemon (cleanup does it again harmlessly).
touch "$out/stop"
for p in "${pids[@]}"; do pkill -INT -P "$p" 2>/dev/null; kill "$p" 2>/dev/null; done
kill -TERM "$daemon" 2>/dev/null
for _ in $(seq 120); do kill -0 "$daemon" 2>/dev/null || break; sleep 0.5; done

# --- summary ------------------------------------------------------------------------------------
measured_min=$(awk -v a="$t0_ns" -v b="$end_ns" 'BEGIN { printf "%.1f", (b - a) / 60e9 }')
rates=$(awk -F, 'NR > 1 { n++; a += $2; b += $3; c += $4; l += $6; if ($6 > lm) lm = $6 }
    END { if (n) printf "%.0f %.0f %.0f %.2f %.2f", a / n, b / n, c / n, l / n, lm; else print "0 0 0 0 0" }' "$out/series.csv")
read -r r_nginx r_echo r_host load_mean load_max <<<"$rates"
# Log lines that mention a notice, from the measured span (the log's RFC 3339 stamps sort
# as text), and their count per service=NAME.
t1_stamp=$(date -u -d "@$((end_ns / 1000000000))" +%Y-%m-%dT%H:%M:%S)
awk -v a="$t0_stamp" -v b="$t1_stamp" 'tolower($0) ~ /notice/ && $1 >= a && $1 < b' "$out/daemon.log" \
    >"$out/notices.log"
notice_lines=$(wc -l <"$out/notices.log")
notices_json=$(grep -o 'service=[^ ]*' "$out/notices.log" | sed 's/^service=//; s/"//g' | sort | uniq -c |
    awk 'BEGIN { printf "{" } { printf "%s\"%s\": %d", (NR > 1 ? ", " : ""), $2, $1 } END { print "}" }')
warm_lines=$(grep -c ' WARN ' "$out/daemon.log")
{
echo
echo "=== real traffic: summary ==="
echo "measured:   $measured_min min after a warm-up of $warm_note; detector defaults otherwise"
echo "machine:    $(nproc) CPUs, ${busy_pct} % busy, load average $load_mean mean / $load_max max (1-min, at each read), ${steal_ms} ms of CPU stolen by the hypervisor"
echo "            CPU time of the busiest processes alive at the end: $top_procs"
echo "traffic:    packets/s at tcp-socket-read (mean of the reads): nginx $r_nginx, echo $r_echo, host $r_host"
echo "reads:      $round rounds, $reads_ok commands ok, $reads_failed failed (reads.csv)"
echo
jq -r --argjson t0 "$t0_ns" --argjson t1 "$end_ns" --arg min "$measured_min" --argjson notices "$notices_json" '
    ($min | tonumber) as $m
    | [.incidents[] | select(.opened_ns >= $t0 and .opened_ns < $t1)] as $in
    | (["service", "incidents", "per service-hour", "notices (log)"] | @tsv),
      ( ["nginx", "echo", "host"][] as $s
        | ($in | map(select(.service == $s)) | length) as $n
        | [$s, $n, ($n / ($m / 60) * 100 | round / 100), ($notices[$s] // 0)] | @tsv),
      ( ($in | map(select(.service != "host-wide")) | length) as $n
        | ["total (3 services)", $n, ($n / (3 * $m / 60) * 100 | round / 100), ([$notices[]] | add // 0)] | @tsv),
      ( ($in | map(select(.service == "host-wide")) | length) as $n
        | ["host-wide (groups the above)", $n, "-", "-"] | @tsv)
' "$out/incidents.json" | column -t -s $'\t'
echo
total_rate=$(jq -r --argjson t0 "$t0_ns" --argjson t1 "$end_ns" --arg min "$measured_min" '
    [.incidents[] | select(.opened_ns >= $t0 and .opened_ns < $t1 and .service != "host-wide")] | length
    | . / (3 * ($min | tonumber) / 60) * 100 | round / 100' "$out/incidents.json")
verdict="within"
awk -v r="$total_rate" 'BEGIN { exit !(r > 1) }' && verdict="ABOVE"
echo "target:     at most 1 incident per service-hour; measured $total_rate over 3 services: $verdict the target"
before=$(jq --argjson t0 "$t0_ns" '[.incidents[] | select(.opened_ns < $t0)] | length' "$out/incidents.json")
echo "            ($before incident(s) opened before the measured span, during the warm-up: not counted)"
echo
echo "incidents (opened in the measured span; those of the warm-up marked and not counted):"
jq -r --argjson t0 "$t0_ns" --argjson t1 "$end_ns" '
    def lat: if . >= 1e9 then "\(. / 1e7 | round / 100)s" elif . >= 1e6 then "\(. / 1e4 | round / 100)ms"
             elif . >= 1e3 then "\(. / 1e2 | round / 10)µs" else "\(round)ns" end;
    def dur: (. / 1e9 | round) as $s | if $s >= 60 then "\($s / 60 | floor)m\($s % 60)s" else "\($s)s" end;
    def two: tostring | if length < 2 then "0" + . else . end;
    def clock: (if . < 0 then "-" else "+" end) as $sign | (if . < 0 then -. else . end) / 1e9 | round
        | "\($sign)\(. / 60 | floor | two):\(. % 60 | two)";
    [.incidents[] | select(.opened_ns < $t1)] | sort_by(.opened_ns)
    | if length == 0 then "  none" else
      (["  id", "service", "opened", "headline", "duration", "cause"] | @tsv),
      (.[] | (.evidence // ((.evidence_json // "null") | fromjson?) // {}) as $e | $e.headline as $h
        | [ "  \(.id)", .service,
            "\((.opened_ns - $t0) | clock) (\(.opened_ns / 1e9 | floor | strftime("%H:%M:%SZ")))\(if .opened_ns < $t0 then " warm-up" else "" end)",
            (if $h then "\($h.probe) p\($h.quantile * 10000 | round / 100) \($h.baseline.value_ns | lat) -> \($h.observed.value_ns | lat) (\($h.ratio * 10 | round / 10)x)"
             elif $e.members then "members: \([$e.members[] | "\(.service) #\(.id)"] | join(", "))"
             else "-" end),
            (if .state == "open" then "open, \(($t1 - .opened_ns) | dur) so far"
             else "\(((.closed_ns // $t1) - .opened_ns) | dur) (\(.state))" end),
            (if .service == "host-wide" then "-" else .cause.kind // "undecided" end)
          ] | @tsv)
      end' "$out/incidents.json" | column -t -s $'\t'
echo "causes:"
jq -r --argjson t1 "$end_ns" '[.incidents[] | select(.opened_ns < $t1 and .cause.summary != null)] | sort_by(.opened_ns)
    | .[] | "  #\(.id) \(.service): \(.cause.kind): \(.cause.summary)"' "$out/incidents.json"
echo
echo "notices:    $notice_lines line(s) of the daemon's log in the measured span mention \"notice\" (notices.log); the first 10:"
head -n 10 "$out/notices.log" | cut -c1-240 | sed 's/^/            /'
echo "            the status's notice fields at the end (since the daemon started):"
jq -r 'if (.notices | type) == "array" then
           (.notices[] | "              \(.latest.service // "?"): \(.count // "?") (latest \(.latest.probe // "") p\((.latest.quantile // 0) * 10000 | round / 100) x\((.latest.ratio // 0) * 100 | round / 100))")
       else
           ([paths as $p | select($p[-1] | tostring | test("notice"; "i")) | {($p | map(tostring) | join(".")): getpath($p)}]
            | if length == 0 then "              none" else "              \(tojson | .[0:300])" end)
       end' "$out/status-end.json" 2>/dev/null
echo "log:        $warm_lines WARN line(s) in the daemon's log"
echo
echo "output:     $out (daemon.log, incidents.json, exports/, reads.csv, series.csv, run.log, tailtrap.toml)"
} | tee -a "$out/run.log" "$out/summary.txt"

if [ -n "$max_rate" ] && awk -v r="$total_rate" -v m="$max_rate" 'BEGIN { exit !(r > m) }'; then
    echo "total $total_rate incidents per service-hour exceeds --max-per-service-hour $max_rate" >&2
    exit 1
fi
exit 0
