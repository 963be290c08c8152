#!/usr/bin/env bash
# bench_plan: the planning commands on real-size shapes, against the issue's target of under a
# second each (none of them allocates the model: docs/planning.md).
#   bench/bench_plan.sh [PTOOL]          default build/cli/ptool
set -euo pipefail
cd "$(dirname "$0")/.."
ptool=${1:-build/cli/ptool}
run() {  # label, command...
    local label=$1; shift
    local t0 t1
    t0=$(date +%s.%N)
    "$@" >/dev/null
    t1=$(date +%s.%N)
    awk -v l="$label" -v a="$t0" -v b="$t1" 'BEGIN { s = b - a; printf "%-44s %7.3f s  (%.0f%% of the 1 s target)\n", l, s, 100 * s }'
}
run "explain llama3_8b (torchtitan's 70B plan shape)" "$ptool" explain models/scale/llama3_8b.yaml plans/scale/llama3_70b_torchtitan.yaml --cluster clusters/h100_8x8.yaml
run "explain llama3_70b dp8 x tp8" "$ptool" explain models/scale/llama3_70b.yaml plans/scale/llama3_70b_torchtitan.yaml --cluster clusters/h100_8x8.yaml
run "explain llama3_8b at 131072 tokens, fsdp2 x cp4" "$ptool" explain models/scale/llama3_8b_131k.yaml plans/scale/llama3_8b_fsdp2_cp4.yaml --cluster clusters/h100_8x8.yaml
run "plan llama3_8b on 8 H100s" "$ptool" plan models/scale/llama3_8b.yaml --cluster clusters/h100_8x8.yaml --world-size 8
run "plan llama3_70b on 64 H100s" "$ptool" plan models/scale/llama3_70b.yaml --cluster clusters/h100_8x8.yaml
run "explain llama3_405b pp8 x dp8 x tp8 interleaved" "$ptool" explain models/scale/llama3_405b.yaml plans/scale/llama3_405b_torchtitan.yaml --cluster clusters/h100_64x8.yaml
run "plan llama3_405b on 512 H100s (pp in the search)" "$ptool" plan models/scale/llama3_405b.yaml --cluster clusters/h100_64x8.yaml
