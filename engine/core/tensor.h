// Tensor: shape, dtype, device and shared owned storage. Always contiguous (row-major).
//
// A view shares storage at an element offset; narrow(0, ...) of a contiguous tensor is a view,
// which is how dim-0 shards and batch slices avoid copies. Shards along other dims are copies
// (see backend ops). Copy semantics are shallow like torch.Tensor; clone() deep-copies.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/device_memory.h"
#include "core/dtype.h"
#include "core/memory_account.h"
#include "core/shape.h"

namespace ptool {

// Shapes become sizes here only, every product checked: a count past int64, or bytes past what any
// device holds (kMaxTensorBytes, the caching allocator's bound), is a RuntimeError (exit 3) naming
// the tensor's shape and size, never a wrapped number (2^64 bytes was 0: explain reported 916 GiB).
inline constexpr int64_t kMaxTensorBytes = int64_t{1} << 57;  // 128 PiB
int64_t numel_of(const Shape& s);
int64_t leading_numel(
    const Shape& s);  // the product of every dim but the last (the rows of a [.., n] tensor)
// numel_of(s) * element_size, at most kMaxTensorBytes (Tensor::nbytes, and a layout's bytes)
int64_t bytes_of(const Shape& s, size_t element_size);
std::string shape_str(const Shape& s);  // "[12, 10]"

// Raw bytes on one device. CPU storage is 64-byte aligned host memory; cuda storage comes from
// the registered DeviceMemory (the CUDA backend's caching allocator); meta storage has none.
// Each is charged to the allocating thread's memory account (core/memory_account.h).
class Storage {
public:
    Storage(size_t bytes, Device device, bool zero = true);
    ~Storage();
    Storage(const Storage&) = delete;
    Storage& operator=(const Storage&) = delete;

    void* data() { return data_; }
    size_t bytes() const { return bytes_; }
    Device device() const { return device_; }

private:
    void* data_ = nullptr;
    size_t bytes_ = 0;
    Device device_;
    std::shared_ptr<MemoryAccount> account_;
    MemoryUse use_ = MemoryUse::other;
};

// While in scope, the calling thread's host allocations are meta tensors: a model built in it has
// shapes and no bytes (a 70B model's structure in kilobytes; the model byte limit does not apply).
bool meta_allocation_active();
class MetaAllocation {
public:
    MetaAllocation();
    ~MetaAllocation();
    MetaAllocation(const MetaAllocation&) = delete;
    MetaAllocation& operator=(const MetaAllocation&) = delete;

private:
    bool saved_;
};

class Tensor {
public:
    Tensor() = default;
    Tensor(Shape shape, DType dtype, Device device = Device::cpu);  // zero-filled
    // Uninitialised storage, for outputs a kernel overwrites completely.
    static Tensor empty(Shape shape, DType dtype, Device device = Device::cpu);

    static Tensor zeros(Shape shape, DType dtype) { return Tensor(std::move(shape), dtype); }
    static Tensor full(Shape shape, DType dtype, double value);
    static Tensor scalar(double value, DType dtype) { return full({}, dtype, value); }
    // Copies host data into a new tensor of the given dtype (values converted).
    static Tensor from_doubles(const Shape& shape, DType dtype, const std::vector<double>& values);

    bool defined() const { return storage_ != nullptr; }
    const Shape& shape() const { return shape_; }
    int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
    int64_t size(int64_t d) const;  // negative d counts from the end
    int64_t numel() const { return numel_of(shape_); }
    DType dtype() const { return dtype_; }
    Device device() const { return device_; }
    size_t nbytes() const { return static_cast<size_t>(bytes_of(shape_, dtype_size(dtype_))); }

    void* raw() const;
    template <class T>
    T* data() const {
        PTOOL_REQUIRE(dtype_of<T>() == dtype_, "data<{}>() on a {} tensor", dtype_name(dtype_of<T>()),
                      dtype_name(dtype_));
        return static_cast<T*>(raw());
    }

    Tensor reshape(Shape shape) const;  // view; numel must match
    // The same bytes as another dtype (torch's Tensor.view(dtype)), a 1-d view: this tensor's bytes
    // and its offset must be whole elements of `dtype`.
    Tensor view(DType dtype) const;
    Tensor narrow(int64_t dim, int64_t start, int64_t length) const;  // view for dim 0, else copy
    Tensor clone() const;
    Tensor to(DType dtype) const;           // converted copy (a clone when the dtype is the same)
    Tensor to_device(Device device) const;  // a copy on `device` (a clone when it is already there)
    bool shares_storage(const Tensor& other) const { return storage_ == other.storage_; }
    const void* storage_key() const { return storage_.get(); }  // the memory account's key

    // Element access for tests and small host-side logic (slow: converts through double; on a
    // cuda tensor each call is a device copy; a meta tensor reads zeros and keeps no writes, so
    // host bookkeeping runs unchanged in a simulated step).
    double item(int64_t flat_index = 0) const;
    void set(int64_t flat_index, double value);
    std::vector<double> to_doubles() const;

private:
    Tensor narrow_element(int64_t flat_index) const;  // a 0-d view of one element
    // A view of this tensor's storage as `shape` from element `offset` (its own shape not copied).
    Tensor aliased(Shape shape, int64_t offset) const;

    std::shared_ptr<Storage> storage_;
    int64_t offset_ = 0;  // in elements
    Shape shape_;
    DType dtype_ = DType::float32;
    Device device_ = Device::cpu;
};

// Element i of an int64 or int32 id tensor.
int64_t id_at(const Tensor& ids, int64_t i);

}  // namespace ptool
