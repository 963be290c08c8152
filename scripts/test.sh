#!/usr/bin/env bash
# The tests on a fresh Debian machine: install what is missing (python3-torch too), build, ctest.
# Extra args go to cmake (scripts/build.sh): CI passes -DPTOOL_UNITY=ON (its time: docs/testing.md).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
scripts/build.sh "$@"
cd build
ctest --output-on-failure -j"$(nproc)"
