// What PyTorch allocates that ptool's own step does not, and what it frees sooner: the framework
// tally of the memory account (core/memory_account.h), which explain replays through PyTorch's
// caching allocator for the allocated and reserved peaks a PyTorch run of the plan reaches.
//
//   Tensor lse = torch_only({b * h, t}, DType::float32, MemoryUse::activations);  // SDPA's logsumexp
//   save({q, k, v, lse});          // lives as long as the saved tensors, in the framework tally only
//   torch_release(logits);         // PyTorch's training loop drops it here; ptool keeps it
//   { TorchAllocScope own(TorchAlloc::ptool_only); ... }   // ptool's stand-ins PyTorch never makes
//
// A torch-only tensor is a meta tensor: no bytes behind it on any device, in real runs too (where
// the account counts it for the framework tally alone; verify's measured peak is ptool's).
#pragma once

#include "core/memory_account.h"
#include "core/tensor.h"

namespace ptool {

Tensor torch_only(Shape shape, DType dtype, MemoryUse use, AllocStream stream = AllocStream::compute);
void torch_release(const Tensor& t);

}  // namespace ptool
