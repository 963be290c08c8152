// Fused elementwise ops (Backend::gated_activation and its backward: one pass, one GPU kernel)
// bitwise the chain of ops they replace, on the CPU (the CUDA kernels: test_cuda_backend).
#include <cstring>

#include "backend/backend.h"
#include "core/rng.h"
#include "test_helpers.h"

using namespace ptool;

namespace test_fused_elementwise {

namespace {

Tensor random(const Shape& s, DType dt, uint64_t seed) {
    Tensor t(s, dt);
    const CounterRng rng(seed, 3);
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, 4.0 * rng.uniform(static_cast<uint64_t>(i)) - 2.0);
    return t;
}

}  // namespace

TEST_CASE("gated_activation and its backward are bitwise activation, mul and activation_backward", "[cpu]") {
    Backend& be = backend_for(Device::cpu);
    const Shape s{97, 1031};  // over two threads' grains, odd
    for (DType dt : {DType::float32, DType::float64, DType::bfloat16})
        for (Activation act : {Activation::silu, Activation::gelu, Activation::gelu_tanh, Activation::relu,
                               Activation::tanh}) {
            INFO(dtype_name(dt) << " activation " << static_cast<int>(act));
            const Tensor g = random(s, dt, 1), u = random(s, dt, 2), dh = random(s, dt, 3);
            Tensor a(s, dt), h(s, dt), a2(s, dt), h2(s, dt);
            be.activation(act, g, a), be.mul(a, u, h);
            be.gated_activation(act, g, u, a2, h2);
            CHECK(same_bits(a, a2));
            CHECK(same_bits(h, h2));
            Tensor du(s, dt), da(s, dt), dg(s, dt), du2(s, dt), dg2(s, dt);
            be.mul(dh, a, du), be.mul(dh, u, da), be.activation_backward(act, g, da, dg);
            be.gated_activation_backward(act, g, a, u, dh, du2, dg2);
            CHECK(same_bits(du, du2));
            CHECK(same_bits(dg, dg2));
        }
    Tensor g({3}, DType::float32), bad({4}, DType::float32), y({3}, DType::float32);
    CHECK_THROWS(be.gated_activation(Activation::silu, g, bad, y, y));
}

}  // namespace test_fused_elementwise
