// shimgen runtime: the proxy executor over a graph's table of extern nodes (shimgen_extern_ops.h).
#include "shimgen_extern_ops.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/csrc/inductor/aoti_torch/proxy_executor.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

namespace shimgen {

namespace {

using torch::aot_inductor::tensor_handle_to_tensor_pointer;

thread_local std::string t_op_error;

c10::ScalarType scalar_type(std::string_view name) {
  for (int i = 0; i < static_cast<int>(c10::ScalarType::NumOptions); ++i) {
    const auto type = static_cast<c10::ScalarType>(i);
    if (name == c10::toString(type)) return type;
  }
  TORCH_CHECK(false, "no dtype named ", name);
}

c10::MemoryFormat memory_format(std::string_view name) {
  if (name == "Contiguous") return c10::MemoryFormat::Contiguous;
  if (name == "Preserve") return c10::MemoryFormat::Preserve;
  if (name == "ChannelsLast") return c10::MemoryFormat::ChannelsLast;
  TORCH_CHECK(name == "ChannelsLast3d", "no memory format named ", name);
  return c10::MemoryFormat::ChannelsLast3d;
}

c10::Layout layout(std::string_view name) {
  if (name == "Strided") return c10::Layout::Strided;
  if (name == "Sparse") return c10::Layout::Sparse;
  TORCH_CHECK(name == "Mkldnn", "no layout named ", name);
  return c10::Layout::Mkldnn;
}

// An argument's literal IValue, made once; std::nullopt for one that comes from the call.
std::optional<c10::IValue> literal(const ExternArg& a) {
  switch (a.kind) {
    case ExternArg::kNone:
      return c10::IValue();
    case ExternArg::kFloat:
      return c10::IValue(a.number);
    case ExternArg::kBool:
      return c10::IValue(a.integer != 0);
    case ExternArg::kLiteralInt:
      return c10::IValue(a.integer);
    case ExternArg::kString:
      return c10::IValue(std::string(a.text));
    case ExternArg::kFloats:
      return c10::IValue(std::vector<double>(a.numbers, a.numbers + a.count));
    case ExternArg::kBools:
      return c10::IValue(std::vector<bool>(a.flags, a.flags + a.count));
    case ExternArg::kLiteralInts:
      return c10::IValue(std::vector<int64_t>(a.integers, a.integers + a.count));
    case ExternArg::kStrings:
      return c10::IValue(std::vector<std::string>(a.texts, a.texts + a.count));
    case ExternArg::kScalarType:
      return c10::IValue(scalar_type(a.text));
    case ExternArg::kMemoryFormat:
      return c10::IValue(memory_format(a.text));
    case ExternArg::kLayout:
      return c10::IValue(layout(a.text));
    case ExternArg::kDevice:
      return c10::IValue(c10::Device(std::string(a.text)));
    case ExternArg::kTensor:
    case ExternArg::kInt:
    case ExternArg::kInts:
    case ExternArg::kTensors:
    case ExternArg::kOptionalTensors:
      break;
  }
  return std::nullopt;
}

class Node {
 public:
  explicit Node(const ExternNode& node) : node_(node) {
    literals_.reserve(node.num_args);
    for (size_t i = 0; i < node.num_args; ++i) literals_.push_back(literal(node.args[i]));
  }

  void call(int num_ints, const int64_t* ints, int num_tensors, AtenTensorHandle* tensors) {
    TORCH_CHECK(num_ints == node_.num_ints && num_tensors == node_.num_tensors, node_.name,
                ": unexpected argument count");
    // Looked up on the first call: an op whose body is in Python is defined once its module is imported.
    std::call_once(found_, [&] { op_.emplace(c10::Dispatcher::singleton().findSchemaOrThrow(node_.name, node_.overload)); });
    auto tensor = [&](int64_t k) -> at::Tensor& { return *tensor_handle_to_tensor_pointer(tensors[k]); };
    torch::jit::Stack stack;
    stack.reserve(node_.num_args);
    for (size_t i = 0; i < node_.num_args; ++i) {
      if (literals_[i]) {
        stack.push_back(*literals_[i]);
        continue;
      }
      const ExternArg& a = node_.args[i];
      switch (a.kind) {
        case ExternArg::kTensor:
          stack.emplace_back(tensor(a.index));
          break;
        case ExternArg::kInt:
          stack.emplace_back(ints[a.index]);
          break;
        case ExternArg::kInts:
          stack.emplace_back(std::vector<int64_t>(ints + a.index, ints + a.index + a.count));
          break;
        case ExternArg::kTensors: {
          std::vector<at::Tensor> list;
          list.reserve(a.count);
          for (int64_t k = 0; k < a.count; ++k) list.push_back(tensor(a.index + k));
          stack.emplace_back(std::move(list));
          break;
        }
        case ExternArg::kOptionalTensors: {
          c10::List<std::optional<at::Tensor>> list;
          list.reserve(a.count);
          for (int64_t k = 0, next = a.index; k < a.count; ++k) {
            list.push_back(a.flags[k] ? std::optional<at::Tensor>(tensor(next++)) : std::nullopt);
          }
          stack.emplace_back(std::move(list));
          break;
        }
        default:
          TORCH_CHECK(false, node_.name, ": argument ", i, " has no value");
      }
    }
    op_->callBoxed(stack);
    for (size_t i = 0; i < node_.num_results; ++i) {
      const ExternResult& r = node_.results[i];
      switch (r.kind) {
        case ExternResult::kSkip:
          break;
        case ExternResult::kTensor:
          tensor(r.index) = std::move(stack[i]).toTensor();
          break;
        case ExternResult::kTensors: {
          auto list = std::move(stack[i]).toTensorList();
          TORCH_CHECK(static_cast<int64_t>(list.size()) == r.count, node_.name, " returned ", list.size(),
                      " tensors, traced with ", r.count);
          for (int64_t k = 0; k < r.count; ++k) tensor(r.index + k) = list.get(k);
          break;
        }
        case ExternResult::kIntCheck:
          TORCH_CHECK(stack[i].toInt() == ints[r.index], "an int result differs from its traced value");
          break;
      }
    }
  }

 private:
  const ExternNode& node_;
  std::vector<std::optional<c10::IValue>> literals_;
  std::once_flag found_;
  std::optional<c10::OperatorHandle> op_;
};

class ExternOps final : public torch::aot_inductor::ProxyExecutor {
 public:
  ExternOps(const ExternNode* nodes, size_t count) {
    nodes_.reserve(count);
    for (size_t i = 0; i < count; ++i) nodes_.push_back(std::make_unique<Node>(nodes[i]));
  }

  void call_function(int node, int num_ints, int64_t* ints, int num_tensors, AtenTensorHandle* tensors) override {
    try {
      TORCH_CHECK(node >= 0 && static_cast<size_t>(node) < nodes_.size(), "no extern node ", node);
      nodes_[node]->call(num_ints, ints, num_tensors, tensors);
    } catch (const c10::Error& e) {
      t_op_error = e.what_without_backtrace();
      throw;
    } catch (const std::exception& e) {
      t_op_error = e.what();
      throw;
    }
  }

 private:
  std::vector<std::unique_ptr<Node>> nodes_;
};

}  // namespace

AOTIProxyExecutorHandle extern_ops(const ExternNode* nodes, size_t count) {
  // Kept for the process, as the graph's library is: a model may call it until exit.
  auto* ops = new ExternOps(nodes, count);
  return reinterpret_cast<AOTIProxyExecutorHandle>(static_cast<torch::aot_inductor::ProxyExecutor*>(ops));
}

std::string take_op_error() { return std::exchange(t_op_error, {}); }

}  // namespace shimgen
