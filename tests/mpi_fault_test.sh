#!/usr/bin/env bash
# A failing rank under mpirun ends every rank with exit 3 and a message naming rank and collective,
# within the timeout (no hang: each run is capped at 60 s by `timeout`).
set -u
bin=$1
mpirun=(mpirun --oversubscribe --allow-run-as-root -np 3)
passes=0; failures=0
check() {  # MODE "expected message fragment"
    local out rc start=$SECONDS
    out=$(timeout 60 "${mpirun[@]}" "$bin" "$1" 2>&1); rc=$?
    if [[ $rc -eq 3 ]] && grep -qF -- "$2" <<<"$out" && (( SECONDS - start < 30 )); then
        passes=$((passes + 1))
    else
        echo "FAIL: mode $1: exit $rc after $((SECONDS - start)) s (want 3), output:"; echo "$out"
        failures=$((failures + 1))
    fi
}
check throw "rank 1 failed: injected failure"
check timeout "timed out after 1 s in"
check mismatch "collective mismatch: rank 1 all_reduce#1 float32 [16, 10] vs rank 0 all_gather#1 float32 [4, 10]"
echo "$passes passed, $failures failed"
[[ $failures -eq 0 ]]
