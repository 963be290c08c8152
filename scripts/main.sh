#!/usr/bin/env bash
# The main job on a fresh Debian machine: install what is missing, build, then verify shipped
# tensor-parallel plans against the single-device reference.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
./build/cli/ptool run models/mlp.yaml
./build/cli/ptool verify models/mlp_stacked.yaml plans/mlp_stacked_multi_wildcard.yaml
./build/cli/ptool verify models/gpt_block.yaml plans/gpt_block_tp.yaml -q
./build/cli/ptool explain models/mlp.yaml plans/mlp_root_module.yaml
./build/cli/ptool plan models/scale/llama3_70b.yaml --cluster clusters/h100_8x8.yaml --top 3 --verify
./build/cli/ptool verify golden/ -q
