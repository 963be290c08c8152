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
# a Hugging Face config in, its transformers tp plan, verified (the tiny Qwen2 of tests/data/hf)
tmp=$(mktemp -d)
./build/cli/ptool import hf tests/data/hf/tiny-qwen2.json --batch 2 --seq 8 -o "$tmp/qwen2.yaml"
./build/cli/ptool import hf-tp-plan tests/data/hf/tiny-qwen2.json --tp 2 -o "$tmp/qwen2_tp.yaml"
./build/cli/ptool verify "$tmp/qwen2.yaml" "$tmp/qwen2_tp.yaml" -q --report "$tmp/report.html"
rm -rf "$tmp"
./build/cli/ptool verify golden/ -q
