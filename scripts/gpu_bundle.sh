#!/usr/bin/env bash
# Packs a build of this checkout for a GPU machine that has the NVIDIA driver and CUDA 13 but not
# the Debian packages ptool links (yaml-cpp, spdlog, fmt, OpenBLAS, OpenMPI):
#   scripts/gpu_bundle.sh [BUILD] [DEST]          (default: build, .gpu; also writes DEST.tgz)
# DEST/build mirrors BUILD's executables (stripped) and ctest files; DEST/lib holds the shared
# libraries they need, except glibc/libstdc++ and the CUDA libraries the GPU machine brings
# (cuBLAS and NCCL are dlopened; libcudart comes along, it is small). scripts/gpu_checks.sh runs
# from it. The ctest files name BUILD by its absolute path: link that path to DEST/build there.
# With WITH_MPI=1 it also writes DEST-mpi.tgz: this machine's Open MPI (and the libraries its
# plugins load) by absolute path, for `tar xzf DEST-mpi.tgz -C /` on a machine without mpirun.
# There set PMIX_MCA_preg=native: on an H100 VM, mpirun segfaulted in PMIx's default node-regex
# component (pmix_preg_base_generate_ppn) before starting any rank.
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
if [ "${WITH_MPI:-0}" = 1 ]; then
  for p in libopenmpi3 openmpi-bin openmpi-common libpmix2 libhwloc15 libhwloc-plugins libevent-core-2.1-7 \
           libevent-pthreads-2.1-7 libevent-2.1-7 libmunge2 libfabric1 libucx0 libibverbs1 librdmacm1 libnl-3-200 \
           libnl-route-3-200 libpsm2-2 libpsm-infinipath1 libltdl7 libnuma1; do
    dpkg -L "$p" 2>/dev/null || true
  done | while read -r f; do [ -f "$f" ] && echo "$f"; done | sort -u >"$dest.mpi-files"
  tar czf "$dest-mpi.tgz" -T "$dest.mpi-files" 2>/dev/null
  rm "$dest.mpi-files"
  du -sh "$dest-mpi.tgz"
fi
du -sh "$dest" "$dest.tgz"
