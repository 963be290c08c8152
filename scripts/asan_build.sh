#!/usr/bin/env bash
# The clang ASan + UBSan build in build-fuzz/ that both the ASan job (scripts/sanitize.sh address:
# the test suite) and the fuzzers (scripts/fuzz.sh: the libFuzzer harnesses) run from, configured
# alike by both so that neither compiles the engine again (CI time: one instrumented engine build
# instead of two, docs/testing.md). Every UBSan check, coverage instrumentation for libFuzzer
# (-fsanitize=fuzzer-no-link), -O1 -g1 (line tables are enough for a report's stack trace; -O2 -g
# compiles each file about 2.4x slower), no CUDA, no benchmarks.
#   scripts/asan_build.sh [TARGET...]   builds those targets (default: all)
# PTOOL_ASAN_TESTS=OFF configures without the tests (scripts/fuzz.sh alone needs no Catch2); the
# engine's objects are the same either way, so neither script rebuilds what the other built.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang++ >/dev/null || { sudo=""; [[ $(id -u) -ne 0 ]] && sudo=sudo; $sudo apt-get install -y -qq clang >/dev/null; }
CC=clang CXX=clang++ cmake -S . -B build-fuzz -DPTOOL_FUZZ=ON -DPTOOL_WITH_CUDA=OFF -DPTOOL_BENCH=OFF -DPTOOL_UNITY=ON -DBUILD_TESTING=${PTOOL_ASAN_TESTS:-ON} \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" >/dev/null
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build build-fuzz -j"$(nproc)" "${targets[@]}"
