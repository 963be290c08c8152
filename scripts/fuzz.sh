#!/usr/bin/env bash
# Fuzzes the model YAML loader, the plan YAML loader, the safetensors reader, `import hf` on a
# config.json, the cluster file loader and a sharded checkpoint's index with libFuzzer (clang,
# ASan + UBSan), each for SECONDS (default 60), seeded with the shipped files; and fuzz_model_plan,
# which generates valid model + plan pairs and runs explain and a one-step verify.
#   scripts/fuzz.sh [SECONDS] [HARNESS...]   CI runs it with 5; run longer by hand, e.g. scripts/fuzz.sh 600
#                                            (HARNESS: only those, e.g. fuzz_hf_config)
# Findings (crash-*, oom-*, timeout-*) land in build-fuzz/findings/ and fail the script.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
only=" $* "
scripts/setup.sh  # the libraries the engine links (a fresh machine)
# the harnesses in the ASan job's clang build (scripts/asan_build.sh), which CI has built already
PTOOL_ASAN_TESTS=OFF scripts/asan_build.sh fuzz_model_yaml fuzz_plan_yaml fuzz_safetensors fuzz_model_plan fuzz_hf_config fuzz_cluster \
    fuzz_index >/dev/null
mkdir -p build-fuzz/findings
# one harness per core at a time (each libFuzzer run is one process): the same seconds per harness,
# half the wall time on the 2-core machine (CI time)
parallel=$(nproc)
run_harness() {  # NAME CORPUS: its log in build-fuzz/NAME.log, its exit status in build-fuzz/NAME.rc
    local rc=0
    ./build-fuzz/tests/fuzz/$1 "$2" -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 \
        -timeout=10 -artifact_prefix=build-fuzz/findings/"$1"- -print_final_stats=1 2>build-fuzz/$1.log || rc=$?
    echo $rc >build-fuzz/$1.rc
}
ran=()
for h in fuzz_model_yaml:models fuzz_plan_yaml:plans fuzz_safetensors:golden fuzz_model_plan: fuzz_hf_config:tests/data/hf \
         fuzz_cluster:clusters fuzz_index:index; do
    name=${h%%:*}
    [[ "$only" == "  " || "$only" == *" $name "* ]] || continue
    corpus=build-fuzz/corpus/$name
    mkdir -p "$corpus"
    if [[ "${h#*:}" == index ]]; then  # indexes of the harness's two shards (a.safetensors: w, x; b.safetensors: y)
        echo '{"metadata": {"total_size": 40}, "weight_map": {"w": "a.safetensors", "x": "a.safetensors", "y": "b.safetensors"}}' >"$corpus/full.json"
        echo '{"weight_map": {"w": "a.safetensors", "y": "b.safetensors"}}' >"$corpus/part.json"
        echo '{"weight_map": {"x": "b.safetensors"}}' >"$corpus/wrong.json"
    elif [[ -n "${h#*:}" ]]; then cp -n "${h#*:}"/* "$corpus"/ 2>/dev/null || true
    else  # the generator reads its choices from the bytes: start from long random inputs, not empty ones
        for i in $(seq 64); do [[ -f "$corpus/seed$i" ]] || head -c 600 /dev/urandom >"$corpus/seed$i"; done
    fi
    while (( $(jobs -rp | wc -l) >= parallel )); do wait -n || true; done
    echo "fuzz: $name for ${seconds}s"
    rm -f build-fuzz/$name.rc
    run_harness "$name" "$corpus" &
    ran+=("$name")
done
wait
status=0
passes=0
failures=0
for name in "${ran[@]}"; do
    if [[ "$(cat build-fuzz/$name.rc 2>/dev/null)" != 0 ]]; then
        status=1
        failures=$((failures + 1))
        echo "fuzz: $name failed"
        tail -30 build-fuzz/$name.log
    else
        passes=$((passes + 1))
    fi
    grep -E "stat::number_of_executed_units|stat::average_exec_per_sec|cov:" build-fuzz/$name.log | tail -3
done
echo "fuzz: $passes passed, $failures failed"
exit $status
