#!/usr/bin/env bash
# A failing rank under mpirun ends every rank with exit 3 and a message naming rank and collective,
# within the timeout (no hang: each run is capped at 60 s by `timeout`), and no process is left.
set -u
bin=$1
mpirun=(mpirun --oversubscribe --allow-run-as-root -np 3)
passes=0; failures=0
check() {  # MODE "expected message fragment" [expected exit code]
    local out rc start=$SECONDS want=${3:-3}
    out=$(timeout 60 "${mpirun[@]}" "$bin" "$1" 2>&1); rc=$?
    local left name; name=$(basename "$bin")
    for _ in $(seq 30); do  # zombies re-parented to init are reaped within moments; count only live ones
        left=$(ps -C "$name" -o pid=,stat= | awk '$2 !~ /^Z/ {print $1}')
        [[ -z $left ]] && break; sleep 0.1
    done
    if [[ -n $left ]]; then echo "FAIL: mode $1: processes left running: $left"; pkill -KILL -x "$name"; fi
    if [[ $rc -eq $want && -z $left ]] && grep -qF -- "$2" <<<"$out" && (( SECONDS - start < 30 )); then
        passes=$((passes + 1))
    else
        echo "FAIL: mode $1: exit $rc after $((SECONDS - start)) s (want $want), output:"; echo "$out"
        failures=$((failures + 1))
    fi
}
check throw "rank 1 failed: injected failure"
check timeout "timed out after 1 s in"
check mismatch "collective mismatch: rank 1 all_reduce#1 float32 [16, 10] vs rank 0 all_gather#1 float32 [4, 10]"
check kill "rank 1 was killed by signal 9 (SIGKILL) after all_reduce#0 float32 [16, 10]"
check p2p_timeout "rank 1: recv from rank 0 (tag 7, float32 [16, 10]): no matching send within 1 s"
check p2p_mismatch "rank 1: recv from rank 0 (tag 7) expects float32 [16, 20], rank 0 sent float32 [16, 10]"
check p2p_throw "rank 1 failed: injected failure"
check ok "" 0  # the supervisor passes a clean exit through
PTOOL_NO_SUPERVISOR=1 check throw "rank 1 failed: injected failure"
echo "$passes passed, $failures failed"
[[ $failures -eq 0 ]]
