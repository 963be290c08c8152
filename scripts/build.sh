#!/usr/bin/env bash
# Configures and builds ptool in build/ (optimised, with line tables: -O2 -g1, so backtraces and
# sanitizer reports name file:line; full -g compiled engine/verify/recorder.cpp in 11.8 s against
# 7.5 s at -g1, 2026-11-27, and the suite's build is most of CI's time). Extra args go to cmake
# (-DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g -DNDEBUG" for a debugger's full information).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" "$@" >/dev/null
cmake --build build -j"$(nproc)"
