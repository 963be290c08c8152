#!/usr/bin/env bash
# The GPU checks of the CUDA backend, on a machine with an NVIDIA GPU:
#   scripts/gpu_checks.sh [BUILD] [LOGS] [STEP...]   (default: build, gpu-logs, every step)
# Each step's output goes to LOGS/STEP.log; a summary line per step (exit status, seconds) and the
# log's tail go to stdout. Steps: ctest (ctest -L cuda), cli (tests/cli_test.sh: its GPU branch
# runs --device cuda and, with mpirun on the PATH, nccl under mpirun), golden (every shipped case replayed with
# --device cuda: the CPU-recorded numbers within fp32 tolerance), repro (a golden recorded twice on
# the GPU is bitwise the same), bf16 (the GEMM MLP and the GPT block at bf16 tolerance), nccl (a
# 1-rank mesh, which verify runs over nccl), verdicts (each shipped case, cpu and cuda verdicts
# side by side), float8 (the float8 plans on cuda in float32, the plain and all-gather ones in
# bfloat16, the all-gather golden, and a fault caught: the casts staged through the host), bench (bench_verify at TP 2/4/8 and bench_comm on cuda_local), scale (issue 52's
# real size: the shared Llama-3.2-1B imported at 4 x 2048, `ptool run` on cuda (its first step
# within 5 s of launch), bench/bench_torch.py against PyTorch's FSDP2 step (within 1.5x), and
# `verify` with fully_shard over 2 virtual ranks on the GPU against its two runs (within 3x)).
# From a bundle (scripts/gpu_bundle.sh) set LD_LIBRARY_PATH first.
set -u
cd "$(dirname "$0")/.."
build=${1:-build} logs=${2:-gpu-logs}
shift $(($# < 2 ? $# : 2))
steps=${*:-ctest cli golden repro bf16 float8 nccl verdicts bench scale}
mkdir -p "$logs"
ptool=$build/cli/ptool
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

run_step() {  # NAME LIMIT_S COMMAND...
  local name=$1 limit=$2 t0 rc
  shift 2
  t0=$(date +%s%N)
  timeout "$limit" "$@" >>"$logs/$name.log" 2>&1
  rc=$?
  printf '== %-22s exit %3d  %7.1f s  %s\n' "$name" "$rc" "$(awk -v a="$t0" -v b="$(date +%s%N)" 'BEGIN { print (b - a) / 1e9 }')" "$*"
  tail -n "${TAIL:-6}" "$logs/$name.log" | sed 's/^/   /'
}

for step in $steps; do
  case $step in
    ctest) run_step ctest 420 ctest --test-dir "$build" -L cuda --output-on-failure ;;
    golden) run_step golden 300 "$ptool" verify golden --device cuda ;;
    repro)
      for i in 1 2; do
        run_step repro 120 "$ptool" golden record models/gpt_block.yaml plans/gpt_block_tp.yaml --device cuda -o "$tmp/r$i.safetensors"
      done
      run_step repro 60 cmp "$tmp/r1.safetensors" "$tmp/r2.safetensors"
      run_step repro 60 "$ptool" golden show "$tmp/r1.safetensors" ;;
    bf16)
      run_step bf16 120 "$ptool" verify models/gemm_mlp.yaml plans/gemm_mlp_tp.yaml --dtype bfloat16 --device cuda
      run_step bf16 120 "$ptool" verify models/gpt_block.yaml plans/gpt_block_tp.yaml --dtype bfloat16 --device cuda
      run_step bf16 120 "$ptool" verify models/llama_block.yaml plans/llama_block_tp.yaml --dtype bfloat16 --device cuda ;;
    float8)  # docs/float8.md: the emulation on a GPU's tensors, verdicts as the host's
      for p in tests/data/float8/*.yaml; do
        run_step float8 120 "$ptool" verify models/llama_rope.yaml "$p" --device cuda
      done
      # bf16 compute, as tests/float8_cases.py: the parallel run follows the reference's casts at
      # near-ties; with the float8 all-gather the reference casts its weights from its masters
      for p in llama_rope_fsdp_tp_float8 llama_rope_fsdp_tp_float8_all_gather; do
        sed 's/^  mode: fully_shard$/  mode: fully_shard\n  mixed_precision: {param_dtype: bfloat16, reduce_dtype: float32}/' \
          "tests/data/float8/$p.yaml" >"$tmp/${p}_bf16.yaml"
        run_step float8 120 "$ptool" verify models/llama_rope.yaml "$tmp/${p}_bf16.yaml" --device cuda
      done
      run_step float8 120 "$ptool" verify golden/float8_llama_rope_fsdp_tp_float8_all_gather.safetensors --device cuda
      # a fault must fail with exit 1 (not 2, a refusal, nor a crash)
      PTOOL_FAULT='float8_e4m3_grad:*' run_step float8 120 bash -c "$ptool verify models/llama_rope.yaml tests/data/float8/llama_rope_fsdp_tp_float8.yaml --device cuda; test \$? -eq 1" ;;
    verdicts)  # every shipped golden case run from its YAML on both devices: the verdicts must agree
      for g in golden/*.safetensors; do
        c=$(basename "$g" .safetensors)
        cpu=$(timeout 120 "$ptool" verify "$g" -q >/dev/null 2>&1; echo $?)
        gpu=$(timeout 120 "$ptool" verify "$g" -q --device cuda >"$tmp/out" 2>&1; echo $?)
        echo "$c cpu=$cpu cuda=$gpu $([ "$cpu" = "$gpu" ] && echo same || echo DIFFERENT)" >>"$logs/verdicts.log"
        [ "$cpu" = "$gpu" ] || cat "$tmp/out" >>"$logs/verdicts.log"
      done
      TAIL=40 run_step verdicts 10 grep -c same "$logs/verdicts.log" ;;
    cli)  # the CLI tests, whose GPU branch verifies with --device cuda and under mpirun over nccl
      run_step cli 300 bash tests/cli_test.sh "$ptool" . ;;
    nccl)  # a 1-rank mesh on a GPU machine: verify picks nccl, in-process (ncclCommInitAll over one GPU)
      run_step nccl 120 "$ptool" verify models/mlp_stacked_mse.yaml plans/mlp_stacked_dp2_tp2.yaml --mesh dp=1 --mesh tp=1 --device cuda ;;
    bench)
      run_step bench 400 "$build/bench/bench_verify" models/gemm_mlp_4k.yaml plans/gemm_mlp_tp.yaml cuda
      run_step bench 300 "$build/bench/bench_comm" 8 256 cuda_local ;;
    scale)  # issue 52: the 1B model at 4 x 2048 tokens on one GPU
      "$ptool" import hf bench/llama-3.2-1b.config.json --batch 4 --seq 2048 -o "$tmp/llama1b.yaml" >>"$logs/scale.log" 2>&1
      printf 'mesh: {dp: 2}\ndata_parallel:\n  mesh_dim: dp\n  mode: fully_shard\n  fully_shard: ["model.layers.*"]\n' >"$tmp/fsdp2.yaml"
      TAIL=8 run_step scale 300 "$ptool" run "$tmp/llama1b.yaml" --device cuda --steps 3
      TAIL=8 run_step scale 600 python3 bench/bench_torch.py --device cuda --build "$build" --steps 4
      TAIL=12 run_step scale 900 "$ptool" verify "$tmp/llama1b.yaml" "$tmp/fsdp2.yaml" --device cuda --steps 1 ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
