// Parameter initialisation on the GPU (Backend::draw_init), bitwise the CPU's draw.
//
// Uniform values are drawn by a kernel, one thread an element: Philox4x32-10 and the 53-bit
// mapping are core/rng.h's own inline functions, compiled for the device (integer arithmetic and
// an exact power-of-two scaling), and -scale + 2 scale u is formed with explicitly rounded
// operations (__dmul_rn, __dadd_rn: nvcc would otherwise contract it into one fma, which the host
// does not), then rounded once to the dtype as the host rounds. Normal values take glibc's log and
// cos (Box-Muller, core/rng.cpp), which device code cannot reproduce bit for bit (CUDA's double log
// and cos are within 1-2 ulp of the correctly rounded value, glibc's its own): they are drawn on
// the host's cores (the CPU backend's draw_init) and copied, one transfer a tensor.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "core/rng.h"

namespace ptool {
namespace {
using namespace ptool::cuda;

template <class D>
__global__ void draw_uniform_kernel(D* out, int64_t n, InitDraw d) {
    const double lo = -d.scale, width = 2.0 * d.scale;
    PTOOL_GRID_STRIDE(i, n) {
        const auto g = static_cast<uint64_t>((i / d.run * d.full_len + d.offset) * d.inner + i % d.run);
        const std::array<uint32_t, 4> r = philox4x32(d.seed, d.stream, g >> 1);
        const double u = (g & 1) ? to_unit(r[2], r[3]) : to_unit(r[0], r[1]);
        out[i] = from_acc<D>(static_cast<dacc_t<D>>(__dadd_rn(lo, __dmul_rn(width, u))));
    }
}

}  // namespace

void CudaBackend::draw_init(Tensor& t, const InitDraw& d) {
    const int64_t n = d.run > 0 ? t.numel() : 0;
    if (n == 0) return;
    if (d.normal) {
        Tensor host = Tensor::empty(t.shape(), t.dtype());
        backend_for(Device::cpu).draw_init(host, d);
        copy_bytes(t.raw(), Device::cuda, host.raw(), Device::cpu, host.nbytes());
        return;
    }
    const Launch l = elementwise_launch(n, sm_count());
    dispatch(t.dtype(), [&](auto tag) {
        using D = decltype(tag);
        draw_uniform_kernel<D><<<l.grid, l.block, 0, stream()>>>(ptr<D>(t), n, d);
    });
    check_launch();
}

}  // namespace ptool
