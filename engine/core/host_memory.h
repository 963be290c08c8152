// Host memory for tensors. Large blocks (>= 1 MiB: parameters, gradients, activations, buckets)
// come from a CachingAllocator over mmap'd transparent huge pages and go back to its cache when
// freed; small ones from the heap.
//
// Why: in the VMs CI runs on, a fresh page costs a fault and the kernel's clearing of it
// (clear_page), and a verify of the 8.4M-parameter gemm_mlp under DDP spent more time there than
// in its GEMMs (perf). The reference run, the rank models and every step allocate the same
// shapes, so a freed block is nearly always reused whole; 2 MiB pages cut the faults of the blocks
// that are new by 512x. The cache is emptied (munmap) when its unused blocks exceed both 1 GiB and
// the bytes in use (so it never holds more than twice what is live, and a model freed while its
// record lives on becomes the next model's memory).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/caching_allocator.h"

namespace ptool {

// Whether every host block comes from the heap, none from the block cache: AddressSanitizer
// builds (gcc's or clang's), so that an overflow of a large tensor is still reported.
bool host_blocks_from_heap();

// 64-byte aligned, zero-filled (padding included) or uninitialised; RuntimeError when out of memory
void* host_allocate(size_t bytes, bool zero);
void host_release(void* p, size_t bytes);
AllocatorStats host_block_stats();  // the large blocks' counters
int64_t available_host_memory();    // /proc/meminfo's MemAvailable in bytes; 0 when unknown
// The address space this process may still map under its limit (RLIMIT_AS, `ulimit -v`): the limit
// less /proc/self/status's VmSize, in bytes; -1 where there is no limit (or it cannot be read).
int64_t address_space_left();

}  // namespace ptool
