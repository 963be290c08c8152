// bench_first_touch: what a fresh page of host memory costs, against writing the same bytes again
// (measured in the same run). A one-verify `ptool verify` first-touches all of its memory (the
// caching allocator reuses it after that: core/host_memory.h), so on a VM where the first touch is
// slow, the process pays it on top of bench_verify's warm rows.
//   ./build/bench/bench_first_touch [MIB]       (default 256)
// Rows: 4 KiB pages, and 2 MiB-aligned mappings with MADV_HUGEPAGE (as host_memory maps large
// blocks); each the best and the worst of 3 fresh mappings.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
    const size_t mib = argc > 1 ? std::stoul(argv[1]) : 256, bytes = mib << 20, huge = size_t{2} << 20;
    std::printf("bench_first_touch: %zu MiB per mapping\n", mib);
    std::printf("  %-22s %14s %14s %14s %10s\n", "pages", "first ms/MiB", "worst ms/MiB", "again ms/MiB",
                "x again");
    for (bool huge_pages : {false, true}) {
        double best = 1e30, worst = 0, again = 1e30;
        for (int rep = 0; rep < 3; ++rep) {
            void* raw =
                mmap(nullptr, bytes + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (raw == MAP_FAILED) {
                std::fprintf(stderr, "bench_first_touch: mmap of %zu MiB failed\n", mib);
                return 1;
            }
            char* p =
                reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(raw) + huge - 1) & ~uintptr_t{huge - 1});
            if (huge_pages) madvise(p, bytes, MADV_HUGEPAGE);
            auto t0 = std::chrono::steady_clock::now();
            std::memset(p, 1, bytes);
            const double first = seconds_since(t0);
            t0 = std::chrono::steady_clock::now();
            std::memset(p, 2, bytes);
            again = std::min(again, seconds_since(t0));
            best = std::min(best, first), worst = std::max(worst, first);
            munmap(raw, bytes + huge);
        }
        std::printf("  %-22s %14.3f %14.3f %14.3f %10.1f\n", huge_pages ? "2 MiB (MADV_HUGEPAGE)" : "4 KiB",
                    best * 1e3 / mib, worst * 1e3 / mib, again * 1e3 / mib, best / again);
    }
    return 0;
}
