#include "core/parallel_for.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>
#include <vector>

#include "core/cores.h"

namespace ptool {

void parallel_for(size_t n, unsigned threads, const std::function<void(size_t)>& fn) {
    std::vector<std::exception_ptr> errors(n);
    std::atomic<size_t> next{0};
    auto work = [&] {
        for (size_t i; (i = next++) < n;) {
            try {
                fn(i);
            } catch (...) {
                errors[i] = std::current_exception();
            }
        }
    };
    if (threads == 0) threads = static_cast<unsigned>(usable_cores());
    std::vector<std::thread> pool;
    for (unsigned k = 1; k < std::min<size_t>(threads, n); ++k) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
    for (auto& e : errors)
        if (e) std::rethrow_exception(e);
}

}  // namespace ptool
