#include "core/tensor.h"

#include <cmath>

#include "core/host_memory.h"

namespace ptool {

namespace {

// The shape's size as a double (it cannot overflow), for the message.
[[noreturn]] [[gnu::cold]] void too_large(const Shape& s, size_t element_size) {
    double n = 1;
    for (int64_t d : s) n *= static_cast<double>(d);
    if (element_size == 0)
        throw RuntimeError(
            fmt::format("a tensor of shape {} ({:.3g} elements, past 2^63), beyond any device's memory",
                        shape_str(s), n));
    const double bytes = n * static_cast<double>(element_size);
    throw RuntimeError(
        fmt::format("a tensor of shape {} ({:.3g} bytes, {:.3g} PiB), beyond any device's memory "
                    "(at most {} PiB)",
                    shape_str(s), bytes, bytes / std::pow(2.0, 50), kMaxTensorBytes >> 50));
}

// The product of s[0, end): a dim of 0 makes it 0 whatever the others are.
int64_t product(const Shape& s, size_t end, size_t element_size) {
    int64_t n = 1;
    bool over = false;
    for (size_t i = 0; i < end; ++i) over |= __builtin_mul_overflow(n, s[i], &n);
    if (over) [[unlikely]] {
        for (size_t i = 0; i < end; ++i)
            if (s[i] == 0) return 0;
        too_large(s, element_size);
    }
    return n;
}

}  // namespace

int64_t numel_of(const Shape& s) {
    return product(s, s.size(), 0);
}

int64_t leading_numel(const Shape& s) {
    return s.empty() ? 1 : product(s, s.size() - 1, 0);
}

int64_t bytes_of(const Shape& s, size_t element_size) {
    const int64_t n = product(s, s.size(), element_size);
    int64_t bytes = 0;
    if (__builtin_mul_overflow(n, static_cast<int64_t>(element_size), &bytes) || bytes > kMaxTensorBytes)
        [[unlikely]]
        too_large(s, element_size);
    return bytes;
}

std::string shape_str(const Shape& s) {
    return fmt::format("[{}]", fmt::join(s, ", "));
}

namespace {
thread_local bool t_meta_allocation = false;
}  // namespace

bool meta_allocation_active() {
    return t_meta_allocation;
}
MetaAllocation::MetaAllocation() : saved_(t_meta_allocation) {
    t_meta_allocation = true;
}
MetaAllocation::~MetaAllocation() {
    t_meta_allocation = saved_;
}

Storage::Storage(size_t bytes, Device device, bool zero)
    : bytes_(bytes), device_(device), account_(current_memory_account()), use_(current_memory_use()) {
    if (account_) account_->charge(this, static_cast<int64_t>(bytes), use_);
    if (device == Device::meta) return;
    if (device != Device::cpu) {
        data_ = device_memory().allocate(bytes);
        if (zero) device_memory().zero(data_, bytes);
        return;
    }
    data_ = host_allocate(bytes, zero);
}

Storage::~Storage() {
    if (account_) account_->credit(this, static_cast<int64_t>(bytes_), use_);
    if (device_ == Device::meta) return;
    if (device_ == Device::cpu)
        host_release(data_, bytes_);
    else
        device_memory().release(data_, bytes_);
}

Tensor::Tensor(Shape shape, DType dtype, Device device)
    : shape_(std::move(shape)),
      dtype_(dtype),
      device_(device == Device::cpu && t_meta_allocation ? Device::meta : device) {
    for (int64_t d : shape_) PTOOL_REQUIRE(d >= 0, "negative size in shape {}", shape_str(shape_));
    storage_ = std::make_shared<Storage>(nbytes(), device_);
}

Tensor Tensor::empty(Shape shape, DType dtype, Device device) {
    Tensor t;
    t.shape_ = std::move(shape);
    t.dtype_ = dtype;
    t.device_ = device == Device::cpu && t_meta_allocation ? Device::meta : device;
    for (int64_t d : t.shape_) PTOOL_REQUIRE(d >= 0, "negative size in shape {}", shape_str(t.shape_));
    t.storage_ = std::make_shared<Storage>(t.nbytes(), t.device_, false);
    return t;
}

Tensor Tensor::full(Shape shape, DType dtype, double value) {
    Tensor t(std::move(shape), dtype);
    if (t.device_ == Device::meta) return t;
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, value);
    return t;
}

Tensor Tensor::from_doubles(const Shape& shape, DType dtype, const std::vector<double>& values) {
    Tensor t(shape, dtype);
    PTOOL_REQUIRE(static_cast<int64_t>(values.size()) == t.numel(), "{} values for shape {}", values.size(),
                  shape_str(shape));
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, values[i]);
    return t;
}

int64_t Tensor::size(int64_t d) const {
    int64_t nd = dim();
    if (d < 0) d += nd;
    PTOOL_REQUIRE(d >= 0 && d < nd, "dim {} out of range for shape {}", d, shape_str(shape_));
    return shape_[d];
}

void* Tensor::raw() const {
    PTOOL_REQUIRE(storage_, "use of an undefined tensor");
    if (device_ == Device::meta) return nullptr;  // no bytes: copies to and from it move nothing
    return static_cast<char*>(storage_->data()) + offset_ * static_cast<int64_t>(dtype_size(dtype_));
}

Tensor Tensor::aliased(Shape shape, int64_t offset) const {
    Tensor t;
    t.storage_ = storage_, t.offset_ = offset, t.shape_ = std::move(shape);
    t.dtype_ = dtype_, t.device_ = device_;
    return t;
}

Tensor Tensor::reshape(Shape shape) const {
    PTOOL_REQUIRE(numel_of(shape) == numel(), "cannot reshape {} to {}", shape_str(shape_), shape_str(shape));
    return aliased(std::move(shape), offset_);
}

Tensor Tensor::view(DType dtype) const {
    const int64_t from = static_cast<int64_t>(dtype_size(dtype_)),
                  to = static_cast<int64_t>(dtype_size(dtype));
    const int64_t bytes = numel() * from, start = offset_ * from;
    PTOOL_REQUIRE(bytes % to == 0 && start % to == 0, "view of {} {} bytes at byte {} as {}",
                  shape_str(shape_), dtype_name(dtype_), start, dtype_name(dtype));
    Tensor t = aliased({bytes / to}, start / to);
    t.dtype_ = dtype;
    return t;
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
    if (d < 0) d += dim();
    PTOOL_REQUIRE(d >= 0 && d < dim() && start >= 0 && length >= 0 && start + length <= shape_[d],
                  "narrow({}, {}, {}) out of range for {}", d, start, length, shape_str(shape_));
    int64_t outer = 1, inner = 1;
    for (int64_t i = 0; i < d; ++i) outer *= shape_[i];
    for (int64_t i = d + 1; i < dim(); ++i) inner *= shape_[i];
    Shape out_shape = shape_;
    out_shape[d] = length;
    if (outer == 1) return aliased(std::move(out_shape), offset_ + start * inner);  // contiguous slab: a view
    Tensor t = empty(out_shape, dtype_, device_);
    const size_t es = dtype_size(dtype_);
    if (t.numel() == 0 || device_ == Device::meta) return t;
    copy_rows(t.raw(), length * inner * es, device_, static_cast<const char*>(raw()) + start * inner * es,
              shape_[d] * inner * es, device_, length * inner * es, outer);
    return t;
}

Tensor Tensor::clone() const {
    return to_device(device_);
}

Tensor Tensor::to_device(Device device) const {
    Tensor t = empty(shape_, dtype_, device);
    copy_bytes(t.raw(), device, raw(), device_, nbytes());
    return t;
}

Tensor Tensor::to(DType dtype) const {
    if (dtype == dtype_) return clone();
    if (device_ == Device::meta) return empty(shape_, dtype, device_);
    if (device_ != Device::cpu) return to_device(Device::cpu).to(dtype).to_device(device_);
    Tensor t(shape_, dtype, device_);
    for (int64_t i = 0; i < numel(); ++i) t.set(i, item(i));
    return t;
}

double Tensor::item(int64_t i) const {
    PTOOL_REQUIRE(i >= 0 && i < numel(), "index {} out of range for {}", i, shape_str(shape_));
    if (device_ == Device::meta) return 0;  // host bookkeeping in a simulated step runs on zeros
    if (device_ != Device::cpu) return narrow_element(i).to_device(Device::cpu).item(0);
    switch (dtype_) {
        case DType::int64:
            return static_cast<double>(data<int64_t>()[i]);
        case DType::int32:
            return static_cast<double>(data<int32_t>()[i]);
        case DType::uint8:
            return static_cast<double>(data<uint8_t>()[i]);
        default:
            return dispatch_float(dtype_, [&](auto tag) -> double {
                using T = decltype(tag);
                return static_cast<double>(static_cast<acc_t<T>>(data<T>()[i]));
            });
    }
}

void Tensor::set(int64_t i, double v) {
    PTOOL_REQUIRE(i >= 0 && i < numel(), "index {} out of range for {}", i, shape_str(shape_));
    if (device_ == Device::meta) return;  // and keeps nothing
    if (device_ != Device::cpu) {
        Tensor host({}, dtype_);
        host.set(0, v);
        Tensor dst = narrow_element(i);
        copy_bytes(dst.raw(), device_, host.raw(), Device::cpu, dtype_size(dtype_));
        return;
    }
    switch (dtype_) {
        case DType::int64:
            data<int64_t>()[i] = static_cast<int64_t>(v);
            return;
        case DType::int32:
            data<int32_t>()[i] = static_cast<int32_t>(v);
            return;
        case DType::uint8:
            data<uint8_t>()[i] = static_cast<uint8_t>(v);
            return;
        default:
            dispatch_float(dtype_, [&](auto tag) {
                using T = decltype(tag);
                data<T>()[i] = T(static_cast<acc_t<T>>(v));
            });
    }
}

Tensor Tensor::narrow_element(int64_t i) const {
    return aliased({}, offset_ + i);
}

std::vector<double> Tensor::to_doubles() const {
    if (device_ != Device::cpu) return to_device(Device::cpu).to_doubles();
    std::vector<double> out(numel());
    for (int64_t i = 0; i < numel(); ++i) out[i] = item(i);
    return out;
}

int64_t id_at(const Tensor& ids, int64_t i) {
    if (ids.device() != Device::cpu) return static_cast<int64_t>(ids.item(i));
    if (ids.dtype() == DType::int64) return ids.data<int64_t>()[i];
    PTOOL_REQUIRE(ids.dtype() == DType::int32, "ids must be int64 or int32, got {}", dtype_name(ids.dtype()));
    return ids.data<int32_t>()[i];
}

}  // namespace ptool
