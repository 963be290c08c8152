#!/usr/bin/env bash
# bench_verify_pipeline: `ptool verify` of a GEMM-heavy pipeline (models/gemm_mlp.yaml cut in two
# stages after net1: 1F1B and GPipe, 4 microbatches) against its own runs measured in the same
# process: the reference's step and the pipeline's step (`verify --json`: reference_seconds and
# the plan's seconds). verify runs both and compares every tensor; on the CPU the reference runs
# beside the pipeline's ranks (docs/architecture.md), so the limit is the longer of the two, and
# the ratio the wall time of the whole command over it (process start, model build, comparisons
# and the report included); `x sum` is over both run one after the other. Best of 3 per row.
# Never gates CI.
#   bench/bench_verify_pipeline.sh [PTOOL]          default build/cli/ptool
set -euo pipefail
cd "$(dirname "$0")/.."
ptool=${1:-build/cli/ptool}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for schedule in 1f1b gpipe; do
    printf 'mesh: {pp: 2}\npipeline_parallel: {split_points: [net2], schedule: %s, microbatches: 4}\n' "$schedule" \
        > "$tmp/$schedule.yaml"
done
printf '%-8s %10s %12s %12s %8s %8s\n' schedule "wall" "reference" "pipeline" "x limit" "x sum"
for schedule in 1f1b gpipe; do
    best=""
    for _ in 1 2 3; do
        t0=$(date +%s.%N)
        "$ptool" verify models/gemm_mlp.yaml "$tmp/$schedule.yaml" -q --json "$tmp/v.json" >/dev/null
        t1=$(date +%s.%N)
        row=$(python3 -c "
import json, sys
v = json.load(open('$tmp/v.json')); p = v['plans'][0]
wall = $t1 - $t0; ref = v['reference_seconds']; run = p['seconds']
assert p['pass'], 'the pipeline did not pass'
print(f'{wall:.4f} {ref:.4f} {run:.4f} {wall / max(ref, run):.2f} {wall / (ref + run):.2f}')")
        if [[ -z $best || $(echo "$row" | awk '{print $1}') < $(echo "$best" | awk '{print $1}') ]]; then best=$row; fi
    done
    echo "$best" | awk -v s="$schedule" '{printf "%-8s %8.1f ms %9.1f ms %9.1f ms %8s %8s\n", s, $1 * 1e3, $2 * 1e3, $3 * 1e3, $4, $5}'
done
