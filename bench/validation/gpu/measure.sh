#!/usr/bin/env bash
# One GPU session's measurements (issue 47), from the repository root on a machine with an NVIDIA GPU,
# PyTorch and transformers, and a bundle of a ptool build in .gpu (scripts/gpu_bundle.sh):
#   bench/validation/gpu/measure.sh OUT
# writes OUT/versions.txt (nvidia-smi, torch, transformers), OUT/calibrate.json (`ptool calibrate
# --device cuda`, timed), OUT/anchor/anchor.jsonl (anchor.py: the training runs of runs.json, each in
# a fresh process, then PyTorch's kernels: gemm, sdpa, bw) and OUT/gpu-logs (scripts/gpu_checks.sh's
# nccl, golden and ctest steps). Each part has its own time limit, so a slow one does not cost the others.
set -u
out=${1:?usage: measure.sh OUT}
mkdir -p "$out"
[ -d .gpu ] || tar xzf .gpu.tgz  # the bundle, carried packed
export LD_LIBRARY_PATH=$PWD/.gpu/lib:${LD_LIBRARY_PATH:-}
ptool=.gpu/build/cli/ptool
part() {  # NAME LIMIT_S COMMAND...
  local name=$1 limit=$2 t0=$SECONDS
  shift 2
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  echo "== $name: exit $? in $((SECONDS - t0)) s"
  tail -n 4 "$out/$name.log"
}
{ nvidia-smi; python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"; } >"$out/versions.txt" 2>&1
head -n 12 "$out/versions.txt"
part calibrate 90 "$ptool" calibrate --device cuda -o "$out/calibrate.json"
part train 200 python3 bench/validation/gpu/anchor.py "$out/anchor" train
part kernels 120 python3 bench/validation/gpu/anchor.py "$out/anchor" gemm sdpa bw
# the GPU checks the comm/ change owes (ctest files name the build by its absolute path: a link there)
# (build/ in the repository copy is ptool's ignored build folder: the bundle stands in for it)
src=$(sed -n 's/^# Source directory: //p' .gpu/build/CTestTestfile.cmake)
if [ -n "$src" ] && mkdir -p "$(dirname "$src")" 2>/dev/null && { [ -e "$src" ] || ln -s "$PWD" "$src"; }; then
  [ -e build ] || ln -s .gpu/build build
fi
part checks 110 scripts/gpu_checks.sh .gpu/build "$out/gpu-logs" nccl golden ctest
