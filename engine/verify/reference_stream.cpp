#include "verify/reference_stream.h"

#include <algorithm>

#include "core/error.h"

namespace ptool {

void ReferenceStream::publish(const StepRecord* step) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        published_.push_back(step);
    }
    cv_.notify_all();
}

void ReferenceStream::finish(std::exception_ptr error) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        finished_ = true;
        error_ = std::move(error);
    }
    cv_.notify_all();
}

bool ReferenceStream::failed() {
    std::lock_guard<std::mutex> lk(mu_);
    return error_ != nullptr;
}

void ReferenceStream::released(int64_t k) {
    {
        std::lock_guard<std::mutex> lk(mu_);
        released_ = std::max(released_, k + 1);
    }
    cv_.notify_all();
}

template <class Ready>
void ReferenceStream::wait_core_given_back(Ready ready) {
    std::unique_lock<std::mutex> lk(mu_);
    if (ready()) return;
    lk.unlock();
    const CoreSlots::Yielded waiting(cores_.get());  // given back first, taken again last
    lk.lock();
    cv_.wait(lk, ready);
    lk.unlock();  // the core is taken again without the lock held
}

void ReferenceStream::wait_for_room(int64_t k) {
    // the reference's core goes to the ranks while they catch up
    wait_core_given_back([&] { return !throttled_ || released_ >= k - 1 || cancelled_.load(); });
    if (cancelled_.load()) throw RuntimeError("the reference run stopped: its parallel run failed");
}

void ReferenceStream::cancel() {
    {
        std::lock_guard<std::mutex> lk(mu_);  // a waiter between its test and its sleep still sees it
        cancelled_.store(true);
    }
    cv_.notify_all();
}

const StepRecord* ReferenceStream::step(int64_t k) {
    wait_core_given_back(
        [&] { return static_cast<int64_t>(published_.size()) > k || finished_ || cancelled_.load(); });
    std::lock_guard<std::mutex> relock(mu_);
    if (static_cast<int64_t>(published_.size()) > k) return published_[static_cast<size_t>(k)];
    if (error_) throw RuntimeError("the reference run failed");  // verify reports the reference's own error
    if (cancelled_.load()) throw RuntimeError("the reference run was cancelled");
    return nullptr;
}

}  // namespace ptool
