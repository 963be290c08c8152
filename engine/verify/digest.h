// Digests: a tensor's bits in 64 bits, so that replicas and construction-time state are compared
// by moving 8 bytes per rank instead of the tensors.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace ptool {

// A 64-bit digest of a tensor's elements that does not depend on how the tensor is cut: the sum
// (mod 2^64) over elements of a hash of (its flat index in the whole tensor, its bits), plus the
// dtype and the whole tensor's shape. A piece at `offset` of `global` hashes its own elements;
// the pieces' sums add up (mod 2^64) to the whole tensor's. Construction-time state is compared
// this way (every rank hashes its piece: no gather).
uint64_t element_hash_sum(const Tensor& piece, const Shape& global, const std::vector<int64_t>& offset);
uint64_t finish_element_hash(uint64_t sum, DType dtype, const Shape& global);

// A 64-bit digest of a host tensor's dtype, shape and bytes (multiply-xorshift mixing in eight
// lanes of 8 bytes; AVX-512 where the CPU has it, the same function): replicas and
// construction-time state are compared by digest, so checking a 32 MiB gradient moves 8 bytes per
// rank, not 32 MiB. Equal digests stand for bitwise equality (a
// collision between two different tensors has probability about 2^-64).
uint64_t tensor_digest(const Tensor& t);

}  // namespace ptool
