// shimgen: the state a package's graphs mutate (buffers updated in place: a running counter, a static KV cache).
//
// Every graph of a package that mutates state joins one StateGroup, made by the first graph's extension and handed to the
// others at import (`_state_group`, `_join_state_group`). Its calls run one at a time across the group, so each call sees
// the updates of the one before, as in eager; on a GPU the group holds the one device copy of each state tensor that all
// its graphs (and their variants) read and write.
#pragma once

#include <ATen/core/TensorBase.h>

#include <mutex>
#include <unordered_map>

namespace shimgen {

struct StateGroup {
  std::mutex calls;
  std::mutex copies_mutex;
  std::unordered_map<const void*, at::TensorBase> device_copies;  // by the host tensor's data: its copy on the GPU
};

constexpr const char* kStateGroupCapsule = "shimgen.StateGroup";

}  // namespace shimgen
