// The reference's record while it is being made, read by a parallel run that runs beside it
// (verify, rank threads of one process): the reference thread publishes each step once its
// record is complete; a parallel rank that needs step k waits for it with its core given back
// (comm/comm_threads.h, CoreSlots), so the reference computes on it meanwhile. Nothing is read
// before it is published, and a published step is never written again.
#pragma once

#include <atomic>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <vector>

#include "comm/comm_threads.h"
#include "verify/run_record.h"

namespace ptool {

class ReferenceStream {
public:
    // throttled: the ranks release each step once done with it, and the reference waits for room
    explicit ReferenceStream(std::shared_ptr<CoreSlots> cores, bool throttled = false)
        : cores_(std::move(cores)), throttled_(throttled) {}

    // The record the reference thread fills (record_run with RecordOptions::publish): complete
    // once finish() was called without an error; read it whole only after the reference ended.
    RunRecord record;

    // --- the reference's side
    void publish(const StepRecord* step);                 // the next step, complete
    void finish(std::exception_ptr error = nullptr);      // no more steps (error: the reference failed)
    bool cancelled() const { return cancelled_.load(); }  // the parallel run failed: stop early
    bool failed();                                        // finish() was given an error
    // Before making step k: when throttled, waits while the ranks still hold steps before k - 1, so
    // at most two steps' records are alive; lends its core to the ranks meanwhile. Throws
    // RuntimeError once cancelled.
    void wait_for_room(int64_t k);

    // --- the parallel side
    // Step k of the reference, waiting for it (its core given back meanwhile); null when the
    // reference has no step k. Throws RuntimeError when the reference failed or was cancelled.
    const StepRecord* step(int64_t k);
    void cancel();  // the parallel run failed: the reference stops at its next step
    // Every rank is done with step k and its record is dropped (from now on the reference keeps
    // at most two steps ahead of the ranks)
    void released(int64_t k);

private:
    // Until ready() (read under the lock), the calling thread's core given back to the ranks' slots
    template <class Ready>
    void wait_core_given_back(Ready ready);

    std::shared_ptr<CoreSlots> cores_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::vector<const StepRecord*> published_;
    int64_t released_ = 0;  // steps [0, released_) are done with
    const bool throttled_;
    bool finished_ = false;
    std::exception_ptr error_;
    std::atomic<bool> cancelled_{false};
};

}  // namespace ptool
