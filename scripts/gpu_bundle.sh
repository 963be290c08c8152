#!/usr/bin/env bash
# Packs a build of this checkout for a GPU machine that has the NVIDIA driver and CUDA 13 but not
# the Debian packages ptool links (yaml-cpp, spdlog, fmt, OpenBLAS, OpenMPI):
#   scripts/gpu_bundle.sh [BUILD] [DEST]          (default: build, .gpu; also writes DEST.tgz)
# DEST/build mirrors BUILD's executables (stripped) and ctest files; DEST/lib holds the shared
# libraries they need, except glibc/libstdc++ and the CUDA libraries the GPU machine brings
# (cuBLAS and NCCL are dlopened; libcudart comes along, it is small). scripts/gpu_checks.sh runs
# from it. The ctest files name BUILD by its absolute path: link that path to DEST/build there.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build} dest=${2:-.gpu}
rm -rf "$dest" && mkdir -p "$dest/lib"
exes=$(find "$build" -path "$build/CMakeFiles" -prune -o -type f -perm -u+x -name 'ptool' -print \
       -o -type f -perm -u+x \( -name 'test_*' -o -name 'bench_*' -o -name comm_fault \) -print)
for f in $exes; do
  mkdir -p "$dest/$(dirname "$f")"
  strip -o "$dest/$f" "$f"
done
for f in $(cd "$build" && find . -name CTestTestfile.cmake -o -name '*_tests-*.cmake' -o -name '*_include-*.cmake'); do
  mkdir -p "$dest/$build/$(dirname "$f")"
  cp "$build/$f" "$dest/$build/$f"
done
skip='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s)\.'
for f in $exes; do ldd "$f"; done | awk '$3 ~ /^\// {print $1, $3}' | sort -u | while read -r name path; do
  [[ $name =~ $skip ]] || cp -L "$path" "$dest/lib/$name"
done
tar czf "$dest.tgz" "$dest"
du -sh "$dest" "$dest.tgz"
