#!/usr/bin/env bash
# Back-to-back comparison of two `baton` binaries: the runs alternate (old, new, old, new, ...)
# so that a noisy moment on the machine hits both alike, and the medians are printed at the end.
#
#   bench/ab.sh OLD NEW [--workload W] [--clients "1 16 64"] [--pairs 3] [--duration 6s] [--warmup 2s]
#
# OLD and NEW are paths to `baton` binaries (build one, copy it aside, change, build the other).
# Each run is `baton bench` with its own three-node cluster, bounded by `timeout`.
set -euo pipefail

usage() { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[[ $# -ge 2 ]] || usage
old=$1 new=$2
shift 2
workload=permit-uniform clients="1 16 64" pairs=3 duration=6s warmup=2s
while [[ $# -gt 0 ]]; do
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
for bin in "$old" "$new"; do
    [[ -x $bin ]] || { echo "ab.sh: $bin is not an executable" >&2; exit 2; }
done

results=$(mktemp)
trap 'rm -f "$results"' EXIT

for n in $clients; do
    for ((i = 1; i <= pairs; i++)); do
        for side in old new; do
            bin=$old
            [[ $side == new ]] && bin=$new
            line=$(timeout 300 "$bin" bench --workload "$workload" --clients "$n" \
                --duration "$duration" --warmup "$warmup" 2>&1 | grep '^workload=' || true)
            [[ -n $line ]] || line="failed"
            echo "$side clients=$n $line"
            echo "$side $n $line" >>"$results"
        done
    done
done

echo
echo "medians ($workload, $pairs runs each):"
for n in $clients; do
    for side in old new; do
        grep "^$side $n " "$results" | python3 -c '
import re, statistics, sys
runs = [dict(re.findall(r"([\w/]+)=([0-9.]+)", l)) for l in sys.stdin if "ops/s" in l]
def med(key):
    vals = [float(r[key]) for r in runs if key in r]
    return statistics.median(vals) if vals else float("nan")
side, n = sys.argv[1], sys.argv[2]
ops, p50, p99 = med("ops/s"), med("p50"), med("p99")
print(f"  {side:>3} clients={n:<3} ops/s={ops:.0f} p50={p50:.2f}ms p99={p99:.2f}ms ({len(runs)} runs)")
' "$side" "$n"
    done
done
