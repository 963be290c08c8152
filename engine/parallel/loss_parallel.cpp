#include "parallel/loss_parallel.h"

#include <cmath>
#include <limits>

#include "core/tensor_ops.h"

namespace ptool {

LossResult vocab_parallel_cross_entropy(const Placed& logits, const Tensor& target,
                                        const LossDivisor& divisor, Communicator& tp) {
    const Device device = logits.t.device();
    if (device == Device::meta) {  // a simulated step: its tensors and collectives, no values
        const int64_t rows = leading_numel(logits.t.shape());
        LossResult r;
        r.grad = Tensor::empty(logits.t.shape(), logits.t.dtype(), device);
        CommScope scope(tp.counter().get(), "(loss)", CommSiteKind::loss_parallel);
        Tensor mx = Tensor::empty({rows}, logits.t.dtype(), device), sum = empty_like(mx),
               picked = empty_like(mx);
        tp.all_reduce(mx, ReduceOp::max);  // the row maxima, sums of exponentials, target logits
        tp.all_reduce(sum, ReduceOp::sum);
        tp.all_reduce(picked, ReduceOp::sum);
        return r;
    }
    const Tensor x = device == Device::cpu ? logits.t : logits.t.to_device(Device::cpu);
    const Tensor ids = target.device() == Device::cpu ? target : target.to_device(Device::cpu);
    const int64_t vocab = logits.global.back(), local = x.size(-1), rows = leading_numel(x.shape());
    const int64_t first = chunk_of(vocab, tp.size(), tp.rank()).offset;  // this rank's first class
    PTOOL_REQUIRE(ids.numel() == rows, "loss_parallel: {} targets for {} rows", ids.numel(), rows);
    const int64_t ignore = divisor.ignore_index;
    int64_t valid = 0;
    for (int64_t i = 0; i < rows; ++i) {
        const int64_t t = id_at(ids, i);
        if (t != ignore && (t < 0 || t >= vocab))
            throw InputError(
                fmt::format("class id {} at position {} is out of range for {} classes", t, i, vocab));
        valid += t != ignore;
    }
    const double n = divisor.count ? *divisor.count : static_cast<double>(valid);
    LossResult r;
    r.grad = Tensor::empty(x.shape(), x.dtype());
    CommScope scope(tp.counter().get(), "(loss)", CommSiteKind::loss_parallel);
    dispatch_float(x.dtype(), [&](auto tag) {
        using T = decltype(tag);
        using A = acc_t<T>;
        const T* px = x.data<T>();
        Tensor mx({rows}, x.dtype()), sum({rows}, x.dtype()), picked({rows}, x.dtype());
        for (int64_t i = 0; i < rows; ++i) {
            A m = -std::numeric_limits<A>::infinity();
            for (int64_t j = 0; j < local; ++j) m = std::max(m, A(px[i * local + j]));
            mx.data<T>()[i] = T(m);
        }
        tp.all_reduce(mx, ReduceOp::max);
        for (int64_t i = 0; i < rows; ++i) {
            const A m = A(mx.data<T>()[i]);
            A s = 0;
            for (int64_t j = 0; j < local; ++j) s += std::exp(A(px[i * local + j]) - m);
            sum.data<T>()[i] = T(s);
            const int64_t id = id_at(ids, i), t = id - first;
            picked.data<T>()[i] = T(id != ignore && t >= 0 && t < local ? A(px[i * local + t]) : A(0));
        }
        tp.all_reduce(sum, ReduceOp::sum);
        tp.all_reduce(picked, ReduceOp::sum);
        double loss = 0.0;
        T* pg = r.grad.data<T>();
        for (int64_t i = 0; i < rows; ++i) {
            const int64_t t = id_at(ids, i);
            const A lse = A(mx.data<T>()[i]) + std::log(A(sum.data<T>()[i]));
            if (t != ignore) loss += static_cast<double>(lse - A(picked.data<T>()[i]));
            for (int64_t j = 0; j < local; ++j)  // an ignored row's gradient 0, also where n is (PyTorch's)
                pg[i * local + j] =
                    t == ignore
                        ? T(0)
                        : T((std::exp(A(px[i * local + j]) - lse) - A(j + first == t ? 1 : 0)) / A(n));
        }
        r.value = static_cast<double>(static_cast<A>(loss / n));
    });
    r.value = Tensor::scalar(r.value, x.dtype()).item();  // a loss is a scalar of the model's dtype
    if (device != Device::cpu) r.grad = r.grad.to_device(device);
    return r;
}

std::vector<std::pair<Collective, int64_t>> vocab_parallel_cross_entropy_cost(const Shape& global,
                                                                              DType dtype) {
    const int64_t bytes = leading_numel(global) * static_cast<int64_t>(dtype_size(dtype));
    return {
        {Collective::all_reduce, bytes}, {Collective::all_reduce, bytes}, {Collective::all_reduce, bytes}};
}

}  // namespace ptool
