// The moe layer's rows (modules/moe_rows.h).
#include "model/modules/moe_rows.h"

namespace ptool::moe_rows {

std::vector<double> host_values(const Tensor& t) {
    const Tensor h = t.device() == Device::cpu ? t : t.to_device(Device::cpu);
    std::vector<double> v(static_cast<size_t>(h.numel()));
    for (int64_t i = 0; i < h.numel(); ++i) v[static_cast<size_t>(i)] = h.item(i);
    return v;
}

Tensor device_tensor(const Shape& shape, DType dtype, Device device, const std::vector<double>& values) {
    if (device == Device::meta) return Tensor::empty(shape, dtype, Device::meta);
    const Tensor t = Tensor::from_doubles(shape, dtype, values);
    return device == Device::cpu ? t : t.to_device(device);
}

ExpertRows expert_rows(const Routing& r, int64_t e, int64_t k, int64_t dim, DType dtype, Device device) {
    const std::vector<int64_t>& slots = r.slots[static_cast<size_t>(e)];
    ExpertRows x;
    x.n = static_cast<int64_t>(slots.size());
    std::vector<double> ids, w;
    if (device != Device::meta) {  // (meta: the shapes only; a host table of rows x dim is no shape)
        ids.reserve(slots.size()), w.reserve(slots.size() * static_cast<size_t>(dim));
        for (int64_t s : slots) {
            ids.push_back(static_cast<double>(s / k));
            w.insert(w.end(), static_cast<size_t>(dim), r.weights[static_cast<size_t>(s)]);
        }
    }
    x.ids = device_tensor({x.n}, DType::int64, device, ids);
    x.weights = device_tensor({1, x.n, dim}, dtype, device, w);
    return x;
}

Placed at_tokens(Backend& be, const ExpertRows& r, const Tensor& rows, const Placed& like) {
    const int64_t d = like.t.size(-1);
    Tensor t({like.t.numel() / d, d}, like.t.dtype(), like.t.device());
    if (r.n) be.embedding_backward(r.ids, rows.reshape({r.n, d}), t);
    return {t.reshape(like.t.shape()), like.p, like.global};
}

std::vector<double> row_dots(Backend& be, const Tensor& a, const Tensor& b, int64_t rows, int64_t dim) {
    if (rows == 0) return {};
    Tensor c = Tensor::empty({rows, 1, 1}, a.dtype(), a.device());
    be.gemm(a.reshape({rows, 1, dim}), false, b.reshape({rows, 1, dim}), true, c);
    return a.device() == Device::meta ? std::vector<double>(static_cast<size_t>(rows), 0.0) : host_values(c);
}

}  // namespace ptool::moe_rows
