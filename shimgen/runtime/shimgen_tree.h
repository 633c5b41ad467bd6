// shimgen runtime: a graph's output tree (GraphSpec::out_nodes, in preorder) rebuilt from the model's flat outputs.
// The one walk both faces share: the CPython face builds Python objects with it, C++ consumers and the runtime's tests
// anything else (paths, text).
#pragma once

#include <cstddef>

#include "shimgen_core.h"
#include "shimgen_graph.h"

namespace shimgen {

// Builds node `node` (advanced past its subtree) from leaves `leaf`... (advanced past those it takes). Builder:
//   Value leaf(size_t i);                               the model's output i
//   Value make(size_t node, Value* children, const size_t* child_nodes);  any other node, its children built (borrowed)
//   bool ok(const Value&);  void release(Value&);       a failed build; what a built child holds
template <class Builder>
auto build_tree(const OutNode* nodes, size_t& node, size_t& leaf, Builder& builder) -> decltype(builder.leaf(0)) {
  using Value = decltype(builder.leaf(0));
  const size_t self = node++;
  const OutNode& n = nodes[self];
  if (n.kind == kTensor) return builder.leaf(leaf++);
  const size_t arity = n.arity > 0 ? static_cast<size_t>(n.arity) : 0;
  SmallArray<Value, 8> children(arity);
  SmallArray<size_t, 8> child_nodes(arity);
  for (size_t c = 0; c < arity; ++c) {
    child_nodes[c] = node;
    children[c] = build_tree(nodes, node, leaf, builder);
    if (!builder.ok(children[c])) {
      for (size_t d = 0; d < c; ++d) builder.release(children[d]);
      return children[c];
    }
  }
  Value made = builder.make(self, children.data(), child_nodes.data());
  for (size_t c = 0; c < arity; ++c) builder.release(children[c]);
  return made;
}

template <class Builder>
auto build_tree(const GraphSpec& spec, Builder& builder) -> decltype(builder.leaf(0)) {
  size_t node = 0, leaf = 0;
  return build_tree(spec.out_nodes, node, leaf, builder);
}

}  // namespace shimgen
