#include "model/target_mask.h"

#include "core/rng.h"
#include "core/tensor_ops.h"

namespace ptool {

void apply_target_mask(Tensor& target, const TargetMaskSpec& spec, int64_t ignore_index, uint64_t seed) {
    if (target.numel() == 0 || target.device() == Device::meta) return;
    PTOOL_REQUIRE(target.dtype() == DType::int64, "masked targets are int64 class ids, got {}",
                  dtype_name(target.dtype()));
    CounterRng rng(seed, stream_id("data", "target_mask"));
    const int64_t rows = target.size(0), per_row = target.numel() / rows;
    const int64_t seq = target.dim() >= 2 ? target.size(1) : 1, inner = per_row / seq;
    auto draw_length = [&](uint64_t index, int64_t lo, int64_t hi) {
        return lo + static_cast<int64_t>(rng.uniform(index) * static_cast<double>(hi - lo + 1));
    };
    int64_t* p = target.data<int64_t>();
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t prompt = draw_length(2 * static_cast<uint64_t>(r), spec.prompt_lo, spec.prompt_hi);
        const int64_t padding =
            draw_length(2 * static_cast<uint64_t>(r) + 1, spec.padding_lo, spec.padding_hi);
        for (int64_t t = 0; t < seq; ++t) {
            const bool edge = t < prompt || t >= seq - padding;
            for (int64_t j = 0; j < inner; ++j) {
                const int64_t i = r * per_row + t * inner + j;
                const bool drop =
                    edge || (spec.fraction > 0 && rng.uniform(2 * static_cast<uint64_t>(rows) +
                                                              static_cast<uint64_t>(i)) < spec.fraction);
                if (drop) p[i] = ignore_index;
            }
        }
    }
}

int64_t valid_targets(const Tensor& target, int64_t ignore_index) {
    const Tensor host = target.device() == Device::cpu ? target : target.to_device(Device::cpu);
    int64_t valid = 0;
    for (int64_t i = 0, n = host.numel(); i < n; ++i) valid += id_at(host, i) != ignore_index;
    return valid;
}

}  // namespace ptool
