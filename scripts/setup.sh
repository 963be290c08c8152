#!/usr/bin/env bash
# Installs the Debian packages ptool needs, only those that are missing.
#   scripts/setup.sh          build dependencies
#   scripts/setup.sh --test   build dependencies + what the tests use (python3-torch for the PyTorch cross-check)
set -euo pipefail

pkgs=(build-essential cmake pkg-config libcli11-dev libyaml-cpp-dev libspdlog-dev catch2
      libopenblas-dev libopenmpi-dev openmpi-bin nlohmann-json3-dev)
if [[ "${1:-}" == "--test" ]]; then
    pkgs+=(python3 python3-torch python3-yaml python3-numpy python3-jsonschema libxml2-utils clang-format)
fi

missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "setup: installing ${missing[*]}"
sudo=""
[[ $(id -u) -ne 0 ]] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
