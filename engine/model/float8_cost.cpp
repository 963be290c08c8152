#include "model/float8_cost.h"

namespace ptool {
namespace {

thread_local bool t_compiled = false;

void count(OpClass op, const Tensor& x) {
    if (x.device() != Device::meta) return;
    meta_count_op(op, x.dtype(), static_cast<double>(x.numel()), framework_kernels(op, x.dtype()));
}

}  // namespace

Float8Compiled::Float8Compiled(bool on) : before_(t_compiled) {
    t_compiled = on;
}

Float8Compiled::~Float8Compiled() {
    t_compiled = before_;
}

void float8_count_amax(const Tensor& x) {
    count(t_compiled ? OpClass::float8_amax_compiled : OpClass::float8_amax_tensorwise, x);
}

void float8_count_scaled_cast(const Tensor& x) {
    count(t_compiled ? OpClass::float8_cast_compiled : OpClass::float8_cast_tensorwise, x);
}

void float8_count_cast(const Tensor& x) {
    float8_count_amax(x);
    float8_count_scaled_cast(x);
}

void float8_count_precompute(const std::vector<Tensor>& shards) {
    if (shards.empty() || shards[0].device() != Device::meta) return;
    double bytes = 0;
    for (const Tensor& s : shards) bytes += static_cast<double>(s.nbytes());
    meta_count_memory(bytes, 6);  // foreach_norm's two launches; stack, clamp, divide, cast
}

void float8_count_layouts(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b) {
    if (a.device() != Device::meta || t_compiled) return;  // compiled: the casts write the layout
    // a float8 operand's copy: 1 byte read, 1 written an element
    if (trans_a) meta_count_memory(2.0 * static_cast<double>(a.numel()), 1);   // a.contiguous()
    if (!trans_b) meta_count_memory(2.0 * static_cast<double>(b.numel()), 1);  // b.t().contiguous().t()
}

}  // namespace ptool
