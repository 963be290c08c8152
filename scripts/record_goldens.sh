#!/usr/bin/env bash
# Re-records golden/ from every shipped plan; each plan's header names its model (the first
# "models/NAME.yaml" in the file). Run after a deliberate change of numerics; CI replays golden/
# with `ptool verify golden/`.
set -euo pipefail
cd "$(dirname "$0")/.."
ptool=${PTOOL:-./build/cli/ptool}
mkdir -p golden
for plan in plans/*.yaml; do
    name=$(basename "$plan" .yaml)
    [[ $name == gemm_mlp_* ]] && continue  # benchmark-sized (8.4M parameters): bench/ runs it
    [[ $name == mpy_bn_local ]] && continue  # differs from the reference by design (local BatchNorm statistics)
    model=$(grep -o -m1 'models/[a-z_0-9]*\.yaml' "$plan") || { echo "$plan names no model" >&2; exit 2; }
    "$ptool" golden record "$model" "$plan" -o "golden/$name.safetensors" --force
done
# the pipeline plans (tests/data/pipeline), each against its one-device reference with the same
# microbatches: golden/pipeline_NAME
for plan in tests/data/pipeline/*.yaml; do
    name=$(basename "$plan" .yaml)
    model=$(grep -o -m1 '\(tests/data/\)\?models/[a-z_0-9]*\.yaml' "$plan") || { echo "$plan names no model" >&2; exit 2; }
    "$ptool" golden record "$model" "$plan" -o "golden/pipeline_$name.safetensors" --force
done
# the float8 plans (tests/data/float8): golden/float8_NAME
for plan in tests/data/float8/*.yaml; do
    name=$(basename "$plan" .yaml)
    model=$(grep -o -m1 '\(tests/data/\)\?models/[a-z_0-9]*\.yaml' "$plan") || { echo "$plan names no model" >&2; exit 2; }
    "$ptool" golden record "$model" "$plan" -o "golden/float8_$name.safetensors" --force
done
