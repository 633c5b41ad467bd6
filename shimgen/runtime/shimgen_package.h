// shimgen runtime, C++ package face: what a package's lib<name>.so runs on. Its generated front door lists the package
// as data (PackageInfo) and calls a Package: the torch in the process checked, the custom ops loaded, each graph's
// models loaded from the package's private directory (lib/<name>/), their weights mapped from its files, the state
// shared as the Python package shares it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "shimgen_core.h"
#include "shimgen_safetensors.h"
#include "shimgen_weights.h"

namespace shimgen {

// One graph on one target, as the front door lists it.
struct UnitInfo {
  const GraphSpec* spec;      // its tables; spec->linked is nullptr: the dynamic model is `model_library`
  size_t graph;               // index into PackageInfo::graphs
  const char* model_library;  // the dynamic model's library, in the package's directory: "<unit>.so"
  const char* weights_file;   // its weights file in the package's directory, or "": in the libraries, or external
  const char* weights_layout;  // the compiled code its weights are laid out for (a weights file's "layout" must match)
  const char* state_owner;    // units with the same owner (and device) share their state tensors
};

struct PackageInfo {
  const char* name;           // "resnet"
  const char* version;
  const char* torch_version;  // the torch it was built against: "2.13.0"
  const char* const* graphs;  // in the spec's order
  size_t num_graphs;
  const UnitInfo* units;
  size_t num_units;
  const char* const* op_libraries;  // file names under <directory>ops/, loaded first
  size_t num_op_libraries;
  const char* weights_env;  // flags.weights = "external": the variable naming the weights file to load ("" otherwise)
};

class Package {
 public:
  // `directory`: the package's private directory ("/prefix/lib/resnet/", ending in '/'). Throws Error: another torch
  // in the process, a missing or broken file.
  Package(const PackageInfo& info, const std::string& directory);
  ~Package();
  Package(const Package&) = delete;
  Package& operator=(const Package&) = delete;

  const PackageInfo& info() const { return info_; }
  const std::string& directory() const { return directory_; }
  // The index of the graph named `graph`; throws InputError naming the package's graphs.
  size_t graph_index(const std::string& graph) const;

  // Runs graph `graph` on the unit of the first input's device (pick_unit). Throws InputError (a bad input) or Error.
  // Thread-safe.
  std::vector<at::Tensor> run(size_t graph, const std::vector<at::Tensor>& inputs);

  // A shimgen weights file: into every unit whose constants it holds all of; a safetensors state dict (by weight
  // name): into every unit, each weight checked. State keeps its values. Calls in flight finish on the old weights.
  // Throws Error.
  void load_weights(const std::string& path);

  // Copies of the state the graphs mutate, by weight name, as the last call left it, on `cuda`'s units or the CPU's.
  // Where graphs of different modules hold state of one name, the later are named "<graph>.<weight>", as the Python
  // package's state() names them. Waits for the state group's calls.
  std::map<std::string, at::Tensor> state(bool cuda);
  // Puts the state back to the values the package was built with, on every device. Waits for the state group's calls.
  void reset_state();

 private:
  struct Unit;
  using Given = std::vector<std::vector<at::TensorBase>>;  // per model, per constant

  void start(Unit& unit);
  void give(Unit& unit, Given& given);
  std::string unit_name(const Unit& unit) const;
  static std::string state_key(const Unit& unit);
  std::vector<std::pair<std::string, at::Tensor>> unit_state(Unit& unit);

  PackageInfo info_;
  std::string directory_;
  std::mutex weights_mutex_;  // one load at a time; guards live_
  // The state: by device and state owner, then by weight (Constant::fqn), the live bytes those units read and write,
  // and the values they started from, typed.
  std::map<std::string, std::unordered_map<std::string, at::Tensor>> live_;
  std::map<std::string, std::unordered_map<std::string, at::Tensor>> initial_;
  StateGroup* state_group_ = nullptr;  // the package's, where a graph mutates state
  std::vector<std::unique_ptr<StateGroup>> groups_;  // those the graphs made: one is the package's, the others unused
  std::vector<std::unique_ptr<Unit>> units_;         // destroyed first: they use the state and the groups
};

// Where `<name>::load(path)` finds the package: `directory` its private directory, `weights` a file to load after.
struct PackagePaths {
  std::string directory;
  std::string weights;
};

// `path` "": `installed` (the directory beside lib<name>.so: directory_of(address) + name + "/"); a directory holding
// lib/<name>/: that one; the private directory itself (".../<name>"); a file: `installed`, with the file's weights.
// Throws Error.
PackagePaths resolve_package(const PackageInfo& info, const std::string& path, const std::string& installed);

// What the front door's load() does: resolve_package beside the library holding `address` (the front door's), the
// Package, the weights. Throws Error.
std::shared_ptr<Package> open_package(const PackageInfo& info, const std::string& path, const void* address);

// The unit of `graph` a call runs on: its only one, or the one of the first input's device (`cuda`: a cuda tensor).
size_t pick_unit(const PackageInfo& info, size_t graph, bool cuda);

// The torch of this process: its library directory ("<torch>/lib/"), "" where unknown; the version a torch's library
// directory records (<lib>/../version.py, or a libtorch distribution's <lib>/../build-version), "" where none.
std::string loaded_torch_directory();
std::string torch_version_in(const std::string& lib_directory);
// Throws Error where `lib_directory`'s torch has another release (X.Y.Z) than `built_for`; goes on where unknown.
void check_torch(const std::string& library, const std::string& built_for, const std::string& lib_directory);

// A shimgen weights file (metadata "format": "shimgen-weights-1"): one unit's entries by model, from a unit's own file
// (its metadata at the top level) or an "external" package's file (by unit, under "units").
class WeightsFile {
 public:
  static bool is_one(const Safetensors& file);
  // `unit`: its name ("forward_cpu"). Throws Error on bad metadata.
  WeightsFile(std::shared_ptr<const Safetensors> file, const std::string& unit);
  const Safetensors& file() const { return *file_; }
  bool holds_unit() const { return holds_unit_; }
  // The compiled code the unit's constants are laid out for (UnitInfo::weights_layout); "" where the file says not.
  const std::string& layout() const { return layout_; }
  // The bytes of each of `constants`, of the dynamic model (`variant` nullptr: metadata "constants", entry ->
  // constant) or of a variant ("variants"[variant->name]: constant -> entry); nullopt where the file lacks one or its
  // size differs.
  std::optional<std::vector<at::TensorBase>> model_weights(const VariantInfo* variant,
                                                           const std::vector<Constant>& constants) const;

 private:
  std::shared_ptr<const Safetensors> file_;
  bool holds_unit_ = false;
  std::string layout_;
  std::unordered_map<std::string, std::string> dynamic_;
  std::unordered_map<std::string, std::unordered_map<std::string, std::string>> variants_;
};

// The bytes of each of `constants` in a safetensors state dict, by weight name (Constant::fqn, less the "model."
// prefix), dtype and shape checked; undefined for those in `state` (nullptr-terminated), which keep the package's
// state. Throws Error naming `graph`: a constant Inductor computed from the weights (`weights_file`: the file to load
// instead), a weight missing or of another dtype or shape.
std::vector<at::TensorBase> weights_by_name(const Safetensors& file, const std::vector<Constant>& constants,
                                            const char* const* state, const std::string& graph,
                                            const std::string& weights_file);

}  // namespace shimgen
