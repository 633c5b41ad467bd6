// shimgen runtime: a CPU model's large buffers kept from one call to the next (shimgen_buffers.h).
#include "shimgen_buffers.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>
#include <mutex>
#include <tuple>

namespace shimgen {

namespace {

struct Block {
  size_t nbytes;
  BufferPool* pool;  // nullptr once the pool is gone: freed when released
};

// One lock for every pool of this runtime and the blocks they handed out: a block may be released on any thread.
// Never destroyed, like the table below: tensors are freed during exit too.
std::mutex& allocation_lock() {
  static auto* lock = new std::mutex;
  return *lock;
}

// Every block a pool handed out or keeps.
std::unordered_map<void*, Block>& blocks() {
  static auto* all = new std::unordered_map<void*, Block>;
  return *all;
}

thread_local BufferPool* t_pool = nullptr;
c10::Allocator* torch_allocator = nullptr;  // the CPU allocator ours is in front of

// Dropping the shared object that holds the allocator would leave torch calling into unmapped code.
void pin_this_library() {
  Dl_info self;
  if (dladdr(reinterpret_cast<void*>(&pin_this_library), &self) && self.dli_fname) {
    dlopen(self.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
  }
}

}  // namespace

class PoolAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    BufferPool* pool = t_pool;
    if (pool == nullptr || nbytes < BufferPool::kMinBytes) return torch_allocator->allocate(nbytes);
    void* data;
    {
      std::lock_guard<std::mutex> guard(allocation_lock());
      std::tie(data, nbytes) = pool->take(nbytes);
    }
    if (data == nullptr) {
      data = c10::alloc_cpu(nbytes);  // throws on failure, as torch's allocator does
      std::lock_guard<std::mutex> guard(allocation_lock());
      blocks()[data] = Block{nbytes, pool};
    }
    c10::profiledCPUMemoryReporter().New(data, nbytes);
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

 private:
  static void release(void* data) {
    if (data == nullptr) return;
    bool ours = false;
    {
      std::lock_guard<std::mutex> guard(allocation_lock());
      auto it = blocks().find(data);
      if (it != blocks().end()) {
        ours = true;
        c10::profiledCPUMemoryReporter().Delete(data);
        if (it->second.pool && it->second.pool->keep(data, it->second.nbytes)) return;
        blocks().erase(it);
      }
    }
    if (ours) {
      c10::free_cpu(data);  // outside the lock
    } else if (auto deleter = torch_allocator->raw_deleter()) {
      deleter(data);  // torch's allocator made it for raw_allocate, through ours
    }
  }
};

BufferPool::BufferPool() {
  static std::once_flag installed;
  std::call_once(installed, [] {
    torch_allocator = c10::GetAllocator(c10::DeviceType::CPU);
    pin_this_library();
    // A process forked while another thread holds the lock (a data loader's workers) must not inherit it held.
    pthread_atfork([] { allocation_lock().lock(); }, [] { allocation_lock().unlock(); },
                   [] { allocation_lock().unlock(); });
    c10::SetAllocator(c10::DeviceType::CPU, new PoolAllocator);  // never destroyed (see the header)
  });
}

BufferPool::~BufferPool() {
  std::vector<void*> freed;
  {
    std::lock_guard<std::mutex> guard(allocation_lock());
    for (auto& [nbytes, list] : kept_) freed.insert(freed.end(), list.begin(), list.end());
    for (void* data : freed) blocks().erase(data);
    for (auto& [data, block] : blocks()) {
      if (block.pool == this) block.pool = nullptr;
    }
  }
  for (void* data : freed) c10::free_cpu(data);
}

BufferPool::Scope::Scope(BufferPool* pool) : pool_(pool), outer_(t_pool) {
  if (pool_) t_pool = pool_;
}

BufferPool::Scope::~Scope() {
  if (!pool_) return;
  t_pool = outer_;
  pool_->end_call();
}

std::pair<void*, size_t> BufferPool::take(size_t nbytes) {
  auto it = kept_.lower_bound(nbytes);
  if (it == kept_.end() || it->first > nbytes + nbytes / 4) {
    ++taken_[nbytes];
    return {nullptr, nbytes};
  }
  const size_t size = it->first;
  void* data = it->second.back();
  it->second.pop_back();
  if (it->second.empty()) kept_.erase(it);
  ++taken_[size];
  return {data, size};
}

bool BufferPool::keep(void* data, size_t nbytes) {
  size_t wanted = 0;
  if (auto it = wanted_.find(nbytes); it != wanted_.end()) wanted = it->second;
  if (auto it = taken_.find(nbytes); it != taken_.end()) wanted = std::max(wanted, it->second);
  auto it = kept_.find(nbytes);
  if ((it == kept_.end() ? 0 : it->second.size()) >= wanted) return false;
  kept_[nbytes].push_back(data);  // no list in kept_ is empty
  return true;
}

void BufferPool::end_call() {
  std::vector<void*> freed;
  {
    std::lock_guard<std::mutex> guard(allocation_lock());
    if (taken_.empty() && kept_.empty()) return;
    wanted_.swap(taken_);
    taken_.clear();
    for (auto it = kept_.begin(); it != kept_.end();) {
      auto wanted = wanted_.find(it->first);
      const size_t keep = wanted == wanted_.end() ? 0 : wanted->second;
      while (it->second.size() > keep) {
        freed.push_back(it->second.back());
        it->second.pop_back();
      }
      it = it->second.empty() ? kept_.erase(it) : std::next(it);
    }
    for (void* data : freed) blocks().erase(data);
  }
  for (void* data : freed) c10::free_cpu(data);
}

size_t BufferPool::kept_bytes() const {
  std::lock_guard<std::mutex> guard(allocation_lock());
  size_t total = 0;
  for (const auto& [nbytes, list] : kept_) total += nbytes * list.size();
  return total;
}

}  // namespace shimgen
