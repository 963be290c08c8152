// Shape: a tensor's sizes, a vector of int64 that keeps up to kInline dims in itself (more go to
// the heap). A tensor is made, viewed, narrowed and copied millions of times in a planner's
// simulations (`ptool plan` of a 405B on 512 GPUs makes about 10 M), and a std::vector's heap block
// per shape cost a malloc and a free each time (perf: 7.6% of that search was the shapes' mallocs
// and frees). The interface is std::vector's where ptool uses it, and a Shape
// converts to and from std::vector<int64_t> implicitly, so code that builds sizes as a vector
// hands them on unchanged.
//
//   Shape s{4, 8};  s.push_back(16);  s[0] == 4;  std::vector<int64_t> v = s;
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <vector>

namespace ptool {

class Shape {
public:
    using value_type = int64_t;
    using size_type = size_t;
    using difference_type = std::ptrdiff_t;
    using reference = int64_t&;
    using const_reference = const int64_t&;
    using pointer = int64_t*;
    using const_pointer = const int64_t*;
    using iterator = int64_t*;
    using const_iterator = const int64_t*;
    using reverse_iterator = std::reverse_iterator<iterator>;
    using const_reverse_iterator = std::reverse_iterator<const_iterator>;
    static constexpr size_t kInline = 6;

    Shape() = default;
    Shape(std::initializer_list<int64_t> dims) { assign(dims.begin(), dims.end()); }
    explicit Shape(size_t n, int64_t value = 0) { assign(n, value); }
    template <class It, class = typename std::iterator_traits<It>::iterator_category>
    Shape(It first, It last) {
        assign(first, last);
    }
    Shape(const std::vector<int64_t>& v) { assign(v.begin(), v.end()); }  // NOLINT: implicit, as intended
    Shape(const Shape& o) { copy_from(o); }
    Shape(Shape&& o) noexcept { take(o); }
    Shape& operator=(const Shape& o) {
        if (this != &o) copy_from(o);
        return *this;
    }
    Shape& operator=(Shape&& o) noexcept {
        if (this != &o) take(o);
        return *this;
    }
    Shape& operator=(std::initializer_list<int64_t> dims) {
        assign(dims.begin(), dims.end());
        return *this;
    }
    operator std::vector<int64_t>() const { return {begin(), end()}; }  // NOLINT: implicit, as intended

    size_t size() const { return size_; }
    bool empty() const { return size_ == 0; }
    size_t capacity() const { return heap_ ? capacity_ : kInline; }
    int64_t* data() { return heap_ ? heap_.get() : inline_; }
    const int64_t* data() const { return heap_ ? heap_.get() : inline_; }
    iterator begin() { return data(); }
    iterator end() { return data() + size_; }
    const_iterator begin() const { return data(); }
    const_iterator end() const { return data() + size_; }
    const_iterator cbegin() const { return begin(); }
    const_iterator cend() const { return end(); }
    reverse_iterator rbegin() { return reverse_iterator(end()); }
    reverse_iterator rend() { return reverse_iterator(begin()); }
    const_reverse_iterator rbegin() const { return const_reverse_iterator(end()); }
    const_reverse_iterator rend() const { return const_reverse_iterator(begin()); }
    int64_t& operator[](size_t i) { return data()[i]; }
    const int64_t& operator[](size_t i) const { return data()[i]; }
    int64_t& at(size_t i) {
        if (i >= size_) throw std::out_of_range("Shape::at");
        return data()[i];
    }
    const int64_t& at(size_t i) const {
        if (i >= size_) throw std::out_of_range("Shape::at");
        return data()[i];
    }
    int64_t& front() { return data()[0]; }
    const int64_t& front() const { return data()[0]; }
    int64_t& back() { return data()[size_ - 1]; }
    const int64_t& back() const { return data()[size_ - 1]; }

    void reserve(size_t n) {
        if (n > capacity()) grow(n);
    }
    void clear() { size_ = 0; }
    void resize(size_t n, int64_t value = 0) {
        reserve(n);
        for (size_t i = size_; i < n; ++i) data()[i] = value;
        size_ = n;
    }
    void push_back(int64_t v) {
        if (size_ == capacity()) grow(2 * size_);
        data()[size_++] = v;
    }
    void emplace_back(int64_t v) { push_back(v); }
    void pop_back() { --size_; }
    void assign(size_t n, int64_t value) {
        size_ = 0;
        resize(n, value);
    }
    template <class It, class = typename std::iterator_traits<It>::iterator_category>
    void assign(It first, It last) {
        const size_t n = static_cast<size_t>(std::distance(first, last));
        size_ = 0;
        reserve(n);
        std::copy(first, last, data());
        size_ = n;
    }
    void assign(std::initializer_list<int64_t> dims) { assign(dims.begin(), dims.end()); }
    iterator insert(const_iterator at, int64_t v) { return insert(at, size_t{1}, v); }
    iterator insert(const_iterator at, size_t n, int64_t v) {  // v is a value: no alias of this shape
        const size_t i = static_cast<size_t>(at - begin());
        reserve(size_ + n);
        std::move_backward(begin() + i, end(), end() + n);
        std::fill(begin() + i, begin() + i + n, v);
        size_ += n;
        return begin() + i;
    }
    iterator insert(const_iterator at, std::initializer_list<int64_t> dims) {
        return insert(at, dims.begin(), dims.end());
    }
    template <class It, class = typename std::iterator_traits<It>::iterator_category>
    iterator insert(const_iterator at, It first, It last) {
        const std::vector<int64_t> added(first, last);  // may alias this shape
        const size_t i = static_cast<size_t>(at - begin()), n = added.size();
        reserve(size_ + n);
        std::move_backward(begin() + i, end(), end() + n);
        std::copy(added.begin(), added.end(), begin() + i);
        size_ += n;
        return begin() + i;
    }
    iterator erase(const_iterator at) { return erase(at, at + 1); }
    iterator erase(const_iterator first, const_iterator last) {
        const size_t i = static_cast<size_t>(first - begin()), n = static_cast<size_t>(last - first);
        std::move(begin() + i + n, end(), begin() + i);
        size_ -= n;
        return begin() + i;
    }

    friend bool operator==(const Shape& a, const Shape& b) {
        return a.size_ == b.size_ && std::equal(a.begin(), a.end(), b.begin());
    }
    friend bool operator!=(const Shape& a, const Shape& b) { return !(a == b); }
    friend bool operator<(const Shape& a, const Shape& b) {
        return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end());
    }
    friend bool operator>(const Shape& a, const Shape& b) { return b < a; }
    friend bool operator<=(const Shape& a, const Shape& b) { return !(b < a); }
    friend bool operator>=(const Shape& a, const Shape& b) { return !(a < b); }

private:
    void grow(size_t n) {
        n = std::max(n, kInline * 2);
        auto bigger = std::make_unique<int64_t[]>(n);
        std::copy(begin(), end(), bigger.get());
        heap_ = std::move(bigger);
        capacity_ = n;
    }
    // the inline dims are copied whole (a fixed-size memcpy the compiler inlines), whatever their count
    void copy_from(const Shape& o) {
        if (o.heap_) return assign(o.begin(), o.end());
        heap_.reset();
        std::memcpy(inline_, o.inline_, sizeof inline_);
        size_ = o.size_;
    }
    void take(Shape& o) {
        if (o.heap_) {
            heap_ = std::move(o.heap_), capacity_ = o.capacity_;
        } else {
            heap_.reset();
            std::memcpy(inline_, o.inline_, sizeof inline_);
        }
        size_ = o.size_;
        o.size_ = 0;
    }

    int64_t inline_[kInline] = {};
    std::unique_ptr<int64_t[]> heap_;  // set where the dims outgrew inline_
    size_t size_ = 0, capacity_ = 0;   // capacity_: heap_'s
};

}  // namespace ptool
