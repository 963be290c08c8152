#!/usr/bin/env bash
# Sanitizer jobs (CI runs both after the tests):
#   scripts/sanitize.sh address   ASan + UBSan build (build-fuzz/, clang: scripts/asan_build.sh, which
#                                 the fuzzers share), the ctest suite but the numbers-only tests
#   scripts/sanitize.sh thread    TSan build (build-tsan/), the threads communicator and the
#                                 in-process verify cases (rank threads are where races live)
# Any sanitizer report fails the test that triggered it (halt_on_error / exitcode).
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:?usage: scripts/sanitize.sh address|thread}
case $kind in
  # clang's, in the build the fuzzers share (scripts/asan_build.sh: every UBSan check, libFuzzer's
  # coverage instrumentation); leaks are not checked (OpenMPI's own allocations are not ours)
  address) dir=build-fuzz
           export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
           export PTOOL_SANITIZER=address ;;
  # OpenBLAS's pthread workers hand their results back through spin flags TSan does not see (a
  # worker's sgemm_beta memset read by the caller after the join was reported on SkylakeX kernels):
  # one BLAS thread, so what TSan checks is ptool's rank threads
  thread)  dir=build-tsan; export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
           export OPENBLAS_NUM_THREADS=1 ;;
  *) echo "unknown sanitizer '$kind'" >&2; exit 2 ;;
esac
scripts/setup.sh --test
if [[ $kind == address ]]; then
  scripts/asan_build.sh 2>&1 | grep -E "error|warning: " || true
else
  # OpenMPI's threads are not ours: the MPI tests run in the ASan job only; the CUDA code is left
  # out (nvcc takes no -fsanitize). -O1 -g1 (line tables: enough for the sanitizers' stack traces)
  # compiles 2.4x faster than RelWithDebInfo's -O2 -g with the instrumentation (verify.cpp: 14.3 s
  # vs 34.3 s), CI time. TSan runs a subset: only what it runs is built (CI time).
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
      -DPTOOL_SANITIZE=thread -DPTOOL_WITH_CUDA=OFF -DPTOOL_BENCH=OFF -DPTOOL_UNITY=ON > /dev/null
  cmake --build "$dir" -j"$(nproc)" --target ptool test_comm_threads 2>&1 | grep -E "error|warning: " || true
fi
test -x "$dir/cli/ptool"
cd "$dir"
if [[ $kind == address ]]; then
  # the cross-check tests numerics against PyTorch, mutation_score re-runs the verify cases with
  # injected bugs, plan_cases verifies the plans the planner wrote (the planner's own code runs in
  # test_parallel), memory_model and plan_layout run explain and verify over every shipped plan
  # for their numbers (test_parallel's runtime test runs every plan's step under ASan), and
  # doc_examples runs the docs' commands, clang_format reads the sources, validation_table prices
  # published runs, cp_cases compares cp plans' numbers with explain's (the runtime test steps every
  # cp plan under ASan): none adds memory coverage the other tests lack (CI time)
  ctest --output-on-failure -j"$(nproc)" \
      -E "torch_crosscheck|mutation_score|plan_cases|memory_model|plan_layout|doc_examples|clang_format|validation_table|cp_cases"
else
  # the threads communicator, and ptool's rank threads beside the reference's thread on every
  # shipped plan (memory_model: each plan's verify, its comparisons rank-local) and the TP and DP
  # cases; test_parallel's binary is not built here (CI time: its reference-beside and rank-local
  # paths are the ones memory_model's verifies take)
  ctest --output-on-failure -j"$(nproc)" -R "test_comm_threads|tp_seeds|dp_cases|memory_model"
fi
