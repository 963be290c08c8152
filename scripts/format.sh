#!/usr/bin/env bash
# clang-format (.clang-format) over the C++ sources: cli/ engine/ tests/ bench/ tools/.
#   scripts/format.sh           formats them in place
#   scripts/format.sh --check   changes nothing; fails naming every file clang-format would change
#                               (ctest clang_format)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "format: clang-format is missing (scripts/setup.sh --test installs it)" >&2; exit 1; }
mapfile -t files < <(find cli engine tests bench tools -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) | sort)
if [[ "${1:-}" != "--check" ]]; then
    clang-format -i "${files[@]}"
    exit 0
fi
bad=()
for f in "${files[@]}"; do
    clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [[ ${#bad[@]} -gt 0 ]]; then
    echo "format: ${#bad[@]} of ${#files[@]} files are not as clang-format $(clang-format --version | grep -o '[0-9][0-9.]*' | head -1) writes them (run scripts/format.sh):"
    printf '  %s\n' "${bad[@]}"
    exit 1
fi
echo "format: ${#files[@]} files as clang-format writes them"
