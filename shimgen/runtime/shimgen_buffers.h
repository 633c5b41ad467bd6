// shimgen runtime: a CPU model's large buffers kept from one call to the next (runtime.keep_buffers).
//
// A buffer that glibc serves with mmap, or from heap it has trimmed since, comes back as fresh pages that the kernel
// zeroes at first touch, on every call (MiniLM at batch 8: 2,100 pages, 3% of the call). While a call runs, the large
// CPU allocations its thread makes (Inductor's buffers and those of the ATen and oneDNN ops it calls, outputs
// included) come from the model's pool; freed, even after the call, they go back to it. A request takes a kept block
// of its size or up to a quarter larger (dynamic sizes that move a little). The pool keeps as many blocks of each size
// as the last call took and frees the rest when a call ends, so it holds about one call's memory.
#pragma once

#include <cstddef>
#include <map>
#include <unordered_map>
#include <utility>
#include <vector>

namespace shimgen {

class BufferPool {
 public:
  static constexpr size_t kMinBytes = 64 << 10;  // smaller blocks come from glibc's heap, already touched

  // The first pool of this runtime puts its allocator in front of torch's CPU allocator (for good: tensors may
  // outlive every pool; the allocator passes every allocation outside a call through).
  BufferPool();
  ~BufferPool();  // frees the kept blocks; those still in tensors are freed when the tensors are
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // While alive, this thread's CPU allocations of kMinBytes or more come from `pool` (nullptr: none). Nests.
  class Scope {
   public:
    explicit Scope(BufferPool* pool);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    BufferPool* pool_;
    BufferPool* outer_;
  };

  size_t kept_bytes() const;  // what the pool holds for the next call, for tests

 private:
  friend class PoolAllocator;
  // Under the runtime's allocation lock: a kept block for `nbytes` and its size, or {nullptr, nbytes} for a new one.
  std::pair<void*, size_t> take(size_t nbytes);
  bool keep(void* data, size_t nbytes);  // under the lock; false: not kept, the caller frees it
  void end_call();

  std::map<size_t, std::vector<void*>> kept_;  // by block size
  std::unordered_map<size_t, size_t> taken_;   // blocks of each size taken by the calls since the last end
  std::unordered_map<size_t, size_t> wanted_;  // blocks of each size the last call took
};

}  // namespace shimgen
