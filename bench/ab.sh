#!/usr/bin/env bash
# Back-to-back comparison of two `baton` binaries: the runs alternate between them (old then new,
# then new then old, ...) so that a noisy moment or a drift hits both alike; medians at the end.
#
#   bench/ab.sh OLD NEW [--workload W] [--clients "1 16 64"] [--pairs 3]
#                       [--duration 6s] [--warmup 2s]
#
# OLD and NEW are paths to `baton` binaries (build one, copy it aside, change, build the other).
# Each run is `baton bench` with its own three-node cluster, stopped by `timeout` after 300 s.
# Ctrl-C stops the run in progress and the script. Exits 1 when a side has no successful run.
set -euo pipefail

usage() { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[[ $# -ge 2 ]] || usage
old=$(realpath -e -- "$1") || usage
new=$(realpath -e -- "$2") || usage
shift 2
workload=permit-uniform clients="1 16 64" pairs=3 duration=6s warmup=2s
while [[ $# -gt 0 ]]; do
    [[ $# -ge 2 ]] || usage
    case $1 in
        --workload) workload=$2 ;;
        --clients) clients=$2 ;;
        --pairs) pairs=$2 ;;
        --duration) duration=$2 ;;
        --warmup) warmup=$2 ;;
        *) usage ;;
    esac
    shift 2
done
[[ $pairs =~ ^[1-9][0-9]*$ ]] || { echo "ab.sh: --pairs wants a positive number" >&2; exit 2; }
[[ $workload != scale && $workload != failover ]] ||
    { echo "ab.sh: $workload prints no ops/s to compare; run it with baton bench" >&2; exit 2; }
for bin in "$old" "$new"; do
    [[ -x $bin ]] || { echo "ab.sh: $bin is not an executable" >&2; exit 2; }
done

results=$(mktemp)
output=$(mktemp)
running=
trap 'rm -f "$results" "$output"' EXIT
# `timeout` runs in a process group of its own, out of the terminal's reach: stop it ourselves.
trap '[[ -z $running ]] || kill -TERM -- "-$running" 2>/dev/null || true; exit 130' INT TERM

run() { # side clients
    local bin=$old out line status=0
    [[ $1 == new ]] && bin=$new
    setsid timeout -k 10 300 "$bin" bench --workload "$workload" --clients "$2" \
        --duration "$duration" --warmup "$warmup" >"$output" 2>&1 &
    running=$!
    wait "$running" || status=$?
    running=
    out=$(<"$output")
    line=$(grep '^workload=' <<<"$out" || true)
    # A bench that exits non-zero may still print its figures (ops/s=0 when nothing succeeded):
    # never a measurement.
    if [[ -z $line || $status != 0 ]]; then
        line="failed (exit $status): $(tail -n 1 <<<"$out")"
    fi
    echo "$1 clients=$2 $line"
    echo "$1 $2 $line" >>"$results"
}

for n in $clients; do
    for ((i = 1; i <= pairs; i++)); do
        if ((i % 2)); then run old "$n"; run new "$n"; else run new "$n"; run old "$n"; fi
    done
done

echo
echo "medians ($workload, $pairs runs each):"
status=0
for n in $clients; do
    for side in old new; do
        grep "^$side $n " "$results" | python3 -c '
import re, statistics, sys
runs = [dict(re.findall(r"([\w/]+)=([0-9.]+)", l)) for l in sys.stdin
        if "ops/s=" in l and l.split()[2] != "failed"]
def med(key):
    vals = [float(r[key]) for r in runs if key in r]
    return statistics.median(vals) if vals else float("nan")
side, n = sys.argv[1], sys.argv[2]
ops, p50, p99, cpu = med("ops/s"), med("p50"), med("p99"), med("cpu_per_op")
print(f"  {side:>3} clients={n:<3} ops/s={ops:.0f} p50={p50:.2f}ms p99={p99:.2f}ms"
      f" node_cpu_per_op={cpu:.0f}us ({len(runs)} runs)")
sys.exit(0 if runs else 1)
' "$side" "$n" || status=1
    done
done
exit "$status"
