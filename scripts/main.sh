#!/usr/bin/env bash
# The main job on a fresh Debian machine: install what is missing, build, run ptool on shipped models.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
./build/cli/ptool run models/mlp.yaml
./build/cli/ptool run models/gpt_block.yaml
