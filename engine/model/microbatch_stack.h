// What a forward keeps for its backward, keyed by microbatch. A schedule may run the forwards of
// microbatches 0..p-1 before the backward of microbatch 0 (GPipe, 1F1B: train/schedule.h), so a
// module's saves cannot be one stack: the backward of microbatch m pops what the forward of m
// pushed. Within one microbatch it is a stack: a module called twice (`shared`) pops its saves in
// reverse order, as autograd does. Modules (their saved tensors, input layouts, checkpoint inputs),
// the styles' hooks and fault injection's hooks all keep their per-call state here.
#pragma once

#include <map>
#include <vector>

#include "core/error.h"

namespace ptool {

template <class T>
class MicrobatchStack {
public:
    void push(int microbatch, T value) { stacks_[microbatch].push_back(std::move(value)); }
    bool empty(int microbatch) const {
        auto it = stacks_.find(microbatch);
        return it == stacks_.end() || it->second.empty();
    }
    // The last value pushed for `microbatch` (which must have one).
    T pop(int microbatch) {
        auto it = stacks_.find(microbatch);
        PTOOL_REQUIRE(it != stacks_.end() && !it->second.empty(), "nothing saved for microbatch {}",
                      microbatch);
        T value = std::move(it->second.back());
        it->second.pop_back();  // an emptied microbatch's stack stays, for its next push (no allocation)
        return value;
    }
    T& top(int microbatch) {
        auto it = stacks_.find(microbatch);
        PTOOL_REQUIRE(it != stacks_.end() && !it->second.empty(), "nothing saved for microbatch {}",
                      microbatch);
        return it->second.back();
    }

private:
    std::map<int, std::vector<T>> stacks_;
};

}  // namespace ptool
