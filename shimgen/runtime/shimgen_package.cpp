// shimgen runtime, C++ package face (shimgen_package.h).
#include "shimgen_package.h"

#include <ATen/Parallel.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <dlfcn.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <utility>

#ifdef SHIMGEN_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace shimgen {

namespace {

constexpr const char* kFormat = "shimgen-weights-1";  // shimgen/inductor/weights.py
constexpr const char* kWeightPrefix = "model.";       // of the program's weight names (shimgen/inductor/weights.py)

bool gpu_available() {
#ifdef SHIMGEN_CUDA
  return c10::cuda::device_count() > 0;
#else
  return false;
#endif
}

bool is_directory(const std::string& path) {
  struct stat st = {};
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void* load_library(const std::string& path, int flags, const std::string& what) {
  if (access(path.c_str(), F_OK) != 0) {
    throw Error(path + ": missing (" + what + "); the package is incomplete: reinstall it");
  }
  dlerror();
  void* library = dlopen(path.c_str(), flags);
  if (!library) {
    const char* error = dlerror();
    throw Error(path + ": cannot be loaded (" + what + "): " + (error ? error : "") + "; reinstall the package");
  }
  return library;
}

bool is_state(const char* const* state, const std::string& fqn) {
  for (const char* const* name = state; name && *name; ++name) {
    if (fqn == *name) return true;
  }
  return false;
}

std::optional<c10::ScalarType> scalar_type(int32_t dtype) {
  if (dtype < 0 || dtype >= static_cast<int32_t>(c10::ScalarType::NumOptions)) return std::nullopt;
  return static_cast<c10::ScalarType>(dtype);
}

// "float32", as torch names a dtype without its module.
std::string dtype_text(c10::ScalarType t) {
  const std::string name = dtype_name(t);
  return name.rfind("torch.", 0) == 0 ? name.substr(6) : name;
}

std::string list_text(const std::vector<int64_t>& sizes) {
  std::string text = "[";
  for (size_t i = 0; i < sizes.size(); ++i) text += (i ? ", " : "") + std::to_string(sizes[i]);
  return text + "]";
}

// A contiguous tensor of its own storage, of a dtype safetensors has: a weights file stores it typed, with its dtype
// and shape (shimgen/inductor/weights.py's Constant.typed).
bool typed(const Constant& c) {
  const std::optional<c10::ScalarType> t = scalar_type(c.dtype);
  if (c.layout != aoti_torch_layout_strided() || c.offset != 0 || !t || c.shape.size() != c.stride.size()) return false;
  static const char* const kNames[] = {"F64", "F32", "F16", "BF16", "I64", "I32",
                                       "I16", "I8",  "U8",  "BOOL", "F8_E4M3", "F8_E5M2"};
  bool storable = false;
  for (const char* name : kNames) storable = storable || safetensors_dtype(name) == t;
  if (!storable) return false;
  int64_t expected = 1, numel = 1;
  bool contiguous = true;
  for (size_t d = c.shape.size(); d-- > 0;) {
    contiguous = contiguous && c.stride[d] == expected;  // exactly as weights.py's Constant.typed: size-1 dims too
    expected *= std::max<int64_t>(c.shape[d], 1);
    numel *= c.shape[d];
  }
  return contiguous || numel <= 1;
}

// Whether an entry of `nbytes` holds constant `c`: exactly its elements where it is typed; else Inductor's slice of the
// constant's storage (padded), at least as long as its strides reach; a prepacked oneDNN weight's size is its own.
bool fits(const Constant& c, size_t nbytes) {
  const std::optional<c10::ScalarType> t = scalar_type(c.dtype);
  if (!t) return false;
  const uint64_t item = c10::elementSize(*t);
  if (typed(c)) {
    uint64_t numel = 1;
    for (int64_t size : c.shape) numel *= static_cast<uint64_t>(size);
    return nbytes == numel * item;
  }
  if (c.layout != aoti_torch_layout_strided()) return nbytes > 0;
  uint64_t extent = 1;
  for (size_t d = 0; d < c.shape.size() && d < c.stride.size(); ++d) {
    if (c.shape[d] == 0) return true;
    extent += static_cast<uint64_t>(c.shape[d] - 1) * static_cast<uint64_t>(c.stride[d]);
  }
  return nbytes >= (static_cast<uint64_t>(c.offset) + extent) * item;
}

// The entry's bytes for constant `c`: over the mapping, or a copy where the entry is not aligned to c's elements.
at::TensorBase bytes_for(const Safetensors& file, const SafetensorsEntry& entry, const Constant& c) {
  at::Tensor bytes = file.bytes(entry);
  const std::optional<c10::ScalarType> t = scalar_type(c.dtype);
  const size_t item = t ? c10::elementSize(*t) : 1;
  if (reinterpret_cast<uintptr_t>(file.data(entry)) % item != 0) bytes = bytes.clone();
  return bytes;
}

// `bytes` as constant `c`'s dtype and shape, where they hold exactly its elements (state is: a buffer); else as they are.
at::Tensor as_constant(const at::Tensor& bytes, const Constant& c) {
  const std::optional<c10::ScalarType> t = scalar_type(c.dtype);
  int64_t numel = 1;
  for (int64_t size : c.shape) numel *= size;
  if (!t || bytes.numel() != numel * static_cast<int64_t>(c10::elementSize(*t))) return bytes;
  return bytes.view(*t).reshape(c.shape);
}

// A state dict's name for the constant's weight.
std::string weight_name(const Constant& c) {
  const std::string& fqn = c.fqn.empty() ? c.name : c.fqn;
  return fqn.rfind(kWeightPrefix, 0) == 0 ? fqn.substr(std::strlen(kWeightPrefix)) : fqn;
}

// One of the program's weights as it is: not a constant Inductor made or changed (freezing's packed and folded ones).
bool plain(const Constant& c) { return typed(c) && c.fqn.rfind(kWeightPrefix, 0) == 0; }

// The release of a version: "2.13.0" of "2.13.0+cu126" or "2.13.0a0+git1234".
std::string release(const std::string& version) {
  size_t end = 0;
  while (end < version.size() && (std::isdigit(static_cast<unsigned char>(version[end])) || version[end] == '.')) ++end;
  while (end > 0 && version[end - 1] == '.') --end;
  return version.substr(0, end);
}

std::string trim(const std::string& text) {
  const size_t begin = text.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return {};
  return text.substr(begin, text.find_last_not_of(" \t\r\n") + 1 - begin);
}

}  // namespace

// ---- torch ----

std::string loaded_torch_directory() {
  std::string file;
  Dl_info self;
  if (dladdr(reinterpret_cast<const void*>(&c10::GetCPUAllocator), &self) && self.dli_fname) file = self.dli_fname;
  auto is_c10 = [](const std::string& path) { return path.compare(path.rfind('/') + 1, 6, "libc10") == 0; };
  if (!is_c10(file)) {  // the address was another object's (a non-PIE executable's PLT): look for the library itself
    file.clear();
    dl_iterate_phdr(
        [](dl_phdr_info* info, size_t, void* found) {
          const char* name = info->dlpi_name;
          const char* base = name ? std::strrchr(name, '/') : nullptr;
          if (!base || std::strncmp(base + 1, "libc10.so", 9) != 0) return 0;
          *static_cast<std::string*>(found) = name;
          return 1;
        },
        &file);
  }
  const size_t slash = file.rfind('/');
  return slash == std::string::npos ? std::string() : file.substr(0, slash + 1);
}

std::string torch_version_in(const std::string& lib_directory) {
  if (lib_directory.empty()) return {};
  const std::string root = lib_directory + (lib_directory.back() == '/' ? "" : "/") + "../";
  std::ifstream version_py(root + "version.py");
  for (std::string line; version_py && std::getline(version_py, line);) {
    if (line.rfind("__version__", 0) != 0) continue;
    const size_t open = line.find_first_of("'\"");
    if (open == std::string::npos) continue;
    const size_t close = line.find(line[open], open + 1);
    if (close != std::string::npos) return line.substr(open + 1, close - open - 1);
  }
  std::ifstream build_version(root + "build-version");
  std::string line;
  if (build_version && std::getline(build_version, line)) return trim(line);
  return {};
}

void check_torch(const std::string& library, const std::string& built_for, const std::string& lib_directory) {
  const std::string loaded = torch_version_in(lib_directory);
  if (loaded.empty() || release(loaded) == release(built_for)) return;
  std::string where = lib_directory;
  if (where.size() > 1 && where.back() == '/') where.pop_back();
  throw Error(library + " was built for torch " + built_for + "; this process loaded torch " + loaded + " (" + where +
              "). Rebuild the package with that torch, or run it with torch " + built_for);
}

// ---- weights ----

bool WeightsFile::is_one(const Safetensors& file) {
  const std::string* format = file.metadata("format");
  return format && *format == kFormat;
}

WeightsFile::WeightsFile(std::shared_ptr<const Safetensors> file, const std::string& unit) : file_(std::move(file)) {
  const std::string damaged = file_->path() + ": its metadata is damaged (";
  auto object = [&](const Json* json, const std::string& what) -> const Json* {
    if (json && json->kind != Json::kObject) throw Error(damaged + what + " is not a JSON object)");
    return json;
  };
  auto strings = [&](const Json* json, const std::string& what, auto add) {
    if (!object(json, what)) return;
    for (const auto& [name, value] : json->object) {
      if (value.kind != Json::kString) throw Error(damaged + what + " maps '" + name + "' to a non-string)");
      add(name, value.string);
    }
  };
  auto parsed = [&](const char* key) {
    std::optional<Json> json;
    if (const std::string* text = file_->metadata(key)) {
      try {
        json = Json::parse(*text);
      } catch (const std::exception&) {
        throw Error(damaged + "'" + key + "' is not JSON)");
      }
    }
    return json;
  };
  // An "external" package's file holds every unit's metadata under "units"; a unit's own file, at its top level.
  const std::optional<Json> units = parsed("units");
  const Json* mine = nullptr;
  std::optional<Json> constants, variants;
  if (units) {
    mine = object(&*units, "'units'") ? units->get(unit) : nullptr;
    if (!mine) return;
    object(mine, "'units'." + unit);
    if (const Json* layout = mine->get("layout"); layout && layout->kind == Json::kString) layout_ = layout->string;
  } else {
    constants = parsed("constants");
    variants = parsed("variants");
    if (const std::string* layout = file_->metadata("layout")) layout_ = *layout;
  }
  holds_unit_ = true;
  if (mine) {  // by constant, as the variants: constants of equal bytes share an entry
    strings(mine->get("constants"), "'constants'",
            [&](const std::string& constant, const std::string& entry) { dynamic_[constant] = entry; });
  } else {  // a unit's own file: by entry
    strings(constants ? &*constants : nullptr, "'constants'",
            [&](const std::string& entry, const std::string& constant) { dynamic_[constant] = entry; });
  }
  const Json* by_variant = object(mine ? mine->get("variants") : variants ? &*variants : nullptr, "'variants'");
  if (!by_variant) return;
  for (const auto& [variant, to_entry] : by_variant->object) {
    auto& map = variants_[variant];
    strings(&to_entry, "'variants'." + variant,
            [&](const std::string& constant, const std::string& entry) { map[constant] = entry; });
  }
}

std::optional<std::vector<at::TensorBase>> WeightsFile::model_weights(const VariantInfo* variant,
                                                                      const std::vector<Constant>& constants) const {
  const std::unordered_map<std::string, std::string>* to_entry = &dynamic_;
  if (variant) {
    auto it = variants_.find(variant->name);
    if (it == variants_.end()) return std::nullopt;
    to_entry = &it->second;
  }
  std::vector<at::TensorBase> weights;
  weights.reserve(constants.size());
  for (const Constant& c : constants) {
    auto named = to_entry->find(c.name);
    const SafetensorsEntry* entry = named == to_entry->end() ? nullptr : file_->find(named->second);
    if (!entry || !fits(c, entry->nbytes())) return std::nullopt;
    weights.push_back(bytes_for(*file_, *entry, c));
  }
  return weights;
}

std::vector<at::TensorBase> weights_by_name(const Safetensors& file, const std::vector<Constant>& constants,
                                            const char* const* state, const std::string& graph,
                                            const std::string& weights_file) {
  std::vector<std::string> derived;
  for (const Constant& c : constants) {
    const std::string name = weight_name(c);
    if (!plain(c) && std::find(derived.begin(), derived.end(), name) == derived.end()) derived.push_back(name);
  }
  if (!derived.empty()) {
    std::string shown;
    for (size_t i = 0; i < derived.size() && i < 3; ++i) shown += (i ? ", " : "") + derived[i];
    if (derived.size() > 3) shown += " and " + std::to_string(derived.size() - 3) + " more";
    throw Error("graph " + graph + ": Inductor computed constants from the weights at build time (" + shown +
                "; flags.freezing = true packs weights for their kernels and merges convolutions with their batch "
                "norms); they cannot be computed at load. Rebuild with the new weights and load that build's " +
                weights_file + ", or build with flags.freezing = false to load a state dict");
  }
  std::vector<at::TensorBase> weights;
  for (const Constant& c : constants) {
    if (is_state(state, c.fqn)) {  // the package's state, whatever the file holds
      weights.emplace_back();
      continue;
    }
    const std::string name = weight_name(c);
    const SafetensorsEntry* entry = file.find(name);
    if (!entry) throw Error("graph " + graph + ": weight '" + name + "' is missing from " + file.path());
    const std::optional<c10::ScalarType> dtype = safetensors_dtype(entry->dtype);
    if (dtype != scalar_type(c.dtype) || entry->shape != c.shape) {
      throw Error("graph " + graph + ": weight '" + name + "' is " + (dtype ? dtype_text(*dtype) : entry->dtype) +
                  list_text(entry->shape) + ", the compiled model's is " + dtype_text(*scalar_type(c.dtype)) +
                  list_text(c.shape));
    }
    weights.push_back(bytes_for(file, *entry, c));
  }
  return weights;
}

// ---- the package ----

struct Package::Unit {
  explicit Unit(const UnitInfo& i) : info(i), spec(*i.spec) {}

  const UnitInfo& info;
  GraphSpec spec;  // info.spec with `linked` set: the Graph keeps a reference to it
  std::unique_ptr<Graph> graph;
  std::vector<std::vector<Constant>> constants;  // per model, once started
  bool ready = false;  // started: it runs in this process (a GPU's unit: where the process has a GPU)
  std::atomic<bool> threads_warned{false};  // threads_mismatch said it once (c10's warning handler)
};

Package::Package(const PackageInfo& info, const std::string& directory) : info_(info), directory_(directory) {
  if (!directory_.empty() && directory_.back() != '/') directory_ += '/';
  check_torch(std::string("lib") + info.name + ".so", info.torch_version, loaded_torch_directory());
  // RTLD_GLOBAL: the libraries register their ops with the dispatcher, where the models find them. Never unloaded.
  for (size_t i = 0; i < info.num_op_libraries; ++i) {
    if (!info.op_libraries[i]) continue;
    load_library(directory_ + "ops/" + info.op_libraries[i], RTLD_NOW | RTLD_GLOBAL, "a custom ops library");
  }
  StateGroup* group = nullptr;
  for (size_t u = 0; u < info.num_units; ++u) {
    units_.push_back(std::make_unique<Unit>(info.units[u]));
    Unit& unit = *units_.back();
    const std::string path = directory_ + unit.info.model_library;
    // RTLD_LOCAL, as the variants: every model's classes and kernels have the names of every other's.
    void* library =
        load_library(path, RTLD_NOW | RTLD_LOCAL, std::string("the compiled model of graph ") + unit.spec.name);
    auto getter = reinterpret_cast<ModelApiGetter>(dlsym(library, kModelApiSymbol));
    if (!getter) {
      throw Error(path + " is no model library of shimgen (it has no " + kModelApiSymbol + "); reinstall the package");
    }
    unit.spec.linked = getter();
    unit.graph = std::make_unique<Graph>(unit.spec, directory_);
    if (unit.graph->stateful()) {  // one state group for the package: its stateful calls take turns
      groups_.emplace_back(unit.graph->state_group());
      if (group) unit.graph->join_state_group(group);
      else group = unit.graph->state_group();
    }
  }
  state_group_ = group;
  const bool gpu = gpu_available();
  for (auto& unit : units_) {
    if (!unit->spec.cuda || gpu) start(*unit);
  }
}

Package::~Package() {
  bool gpu_used = false;
  for (const auto& unit : units_) gpu_used = gpu_used || (unit->spec.cuda && unit->graph->device() >= 0);
  units_.clear();
  if (gpu_used) {  // left to process exit with the GPU's containers, which use their device copies of the state
    for (auto& group : groups_) static_cast<void>(group.release());
  }
}

// The unit's constants, its CPU containers, and the weights of its file. A GPU's constants are read where the process
// has a GPU (reading them asks CUDA which is current); its containers are made by its first call.
void Package::start(Unit& unit) {
  const GraphSpec& spec = unit.spec;
  for (size_t m = 0; m < unit.graph->num_models(); ++m) {
    const Model& model = unit.graph->model(m);
    try {
      unit.constants.push_back(model.api->constants(spec.cuda ? "cuda" : "cpu"));
    } catch (const std::exception& e) {
      throw Error(std::string(spec.name) + "(): cannot read the constants of the compiled model" + model.label() +
                  ": " + e.what());
    }
  }
  unit.graph->create_containers();
  if (*unit.info.weights_file) {
    const std::string path = directory_ + unit.info.weights_file;
    const std::string wrong = path + " does not hold the weights of graph " + spec.name + "; reinstall the package";
    if (access(path.c_str(), F_OK) != 0) throw Error(path + ": missing; reinstall the package");
    std::shared_ptr<const Safetensors> file;
    try {
      file = Safetensors::open(path);
    } catch (const Error& e) {
      throw Error(e.what() + std::string("; reinstall the package"));
    }
    if (!WeightsFile::is_one(*file)) throw Error(wrong);
    const WeightsFile weights(file, unit_name(unit));
    Given given;
    for (size_t m = 0; m < unit.graph->num_models(); ++m) {
      auto model = weights.model_weights(unit.graph->model(m).variant, unit.constants[m]);
      if (!model) throw Error(wrong);
      given.push_back(std::move(*model));
    }
    give(unit, given);
  }
  unit.ready = true;
}

// Hands `given` to the unit's graph, its state constants replaced by the live state of the unit's owner (made from
// these bytes the first time), as _shimgen_weights.Weights._with_state does.
void Package::give(Unit& unit, Given& given) {
  if (unit.graph->stateful()) {
    const std::string key = state_key(unit);
    auto& live = live_[key];
    for (size_t m = 0; m < given.size(); ++m) {
      for (size_t i = 0; i < given[m].size() && i < unit.constants[m].size(); ++i) {
        const std::string& fqn = unit.constants[m][i].fqn;
        if (!is_state(unit.spec.state, fqn)) continue;
        auto it = live.find(fqn);
        if (it == live.end()) {
          if (!given[m][i].defined()) continue;
          it = live.emplace(fqn, at::Tensor(given[m][i]).clone()).first;
          initial_[key].emplace(fqn, as_constant(it->second.clone(), unit.constants[m][i]));
        }
        given[m][i] = it->second;
      }
    }
  }
  std::vector<WeightSet> retired;
  unit.graph->set_weights(given, retired);
}

std::string Package::state_key(const Unit& unit) {
  return std::string(unit.spec.cuda ? "cuda" : "cpu") + '\n' + unit.info.state_owner;
}

// The state tensors a started unit's dynamic model reads and writes where it runs, by weight name: on the CPU its
// live bytes, typed; on a GPU its device copies, once its first call made them (before, the live bytes).
std::vector<std::pair<std::string, at::Tensor>> Package::unit_state(Unit& unit) {
  std::vector<std::pair<std::string, at::Tensor>> held;
  const auto& initial = initial_[state_key(unit)];
  if (unit.spec.cuda) {
    std::unordered_map<std::string, std::string> fqns;
    for (const Constant& c : unit.constants[0]) fqns[c.name] = c.fqn;
    for (auto& [name, t] : unit.graph->state_of(unit.graph->model(0))) held.emplace_back(fqns[name], at::Tensor(t));
    if (!held.empty()) return held;
  }
  for (auto& [fqn, bytes] : live_[state_key(unit)]) {
    const at::Tensor& first = initial.at(fqn);
    const bool untyped = first.scalar_type() == bytes.scalar_type() && first.sizes() == bytes.sizes();
    held.emplace_back(fqn, untyped ? bytes : bytes.view(first.scalar_type()).reshape(first.sizes()));
  }
  return held;
}

std::map<std::string, at::Tensor> Package::state(bool cuda) {
  std::map<std::string, at::Tensor> result;
  if (!state_group_) return result;
  std::lock_guard<std::mutex> turn(state_group_->calls);
  std::lock_guard<std::mutex> lock(weights_mutex_);
  std::vector<std::string> owners;
  for (auto& unit : units_) {
    const std::string& owner = unit->info.state_owner;
    if (!unit->ready || !unit->graph->stateful() || unit->spec.cuda != cuda) continue;
    if (std::find(owners.begin(), owners.end(), owner) != owners.end()) continue;
    const bool first = owners.empty();
    owners.push_back(owner);
    for (auto& [fqn, t] : unit_state(*unit)) {
      const std::string weight = fqn.rfind(kWeightPrefix, 0) == 0 ? fqn.substr(std::strlen(kWeightPrefix)) : fqn;
      result[first || !result.count(weight) ? weight : std::string(unit->spec.name) + "." + weight] = t.clone();
    }
  }
  return result;
}

void Package::reset_state() {
  if (!state_group_) return;
  std::lock_guard<std::mutex> turn(state_group_->calls);
  std::lock_guard<std::mutex> lock(weights_mutex_);
  for (auto& unit : units_) {
    if (!unit->ready || !unit->graph->stateful()) continue;
    const auto& initial = initial_[state_key(*unit)];
    for (auto& [fqn, t] : unit_state(*unit)) t.copy_(initial.at(fqn));
  }
}

std::string Package::unit_name(const Unit& unit) const {
  std::string name = unit.info.model_library;
  if (name.size() > 3 && name.compare(name.size() - 3, 3, ".so") == 0) name.resize(name.size() - 3);
  return name;
}

size_t Package::graph_index(const std::string& graph) const {
  std::string names;
  for (size_t g = 0; g < info_.num_graphs; ++g) {
    if (graph == info_.graphs[g]) return g;
    names += (g ? ", " : "") + std::string(info_.graphs[g]);
  }
  throw InputError(false, "no graph '" + graph + "' in package " + info_.name + " (graphs: " + names + ")");
}

size_t pick_unit(const PackageInfo& info, size_t graph, bool cuda) {
  size_t first = info.num_units;
  for (size_t u = 0; u < info.num_units; ++u) {
    if (info.units[u].graph != graph) continue;
    if (info.units[u].spec->cuda == cuda) return u;
    if (first == info.num_units) first = u;
  }
  if (first == info.num_units) {
    throw InputError(false, "package " + std::string(info.name) + " has no graph " + std::to_string(graph) +
                                " (it has " + std::to_string(info.num_graphs) + ")");
  }
  return first;
}

std::vector<at::Tensor> Package::run(size_t graph, const std::vector<at::Tensor>& inputs) {
  const bool cuda = !inputs.empty() && inputs[0].defined() && inputs[0].is_cuda();
  Unit& unit = *units_[pick_unit(info_, graph, cuda)];
  if (!unit.ready) {
#ifdef SHIMGEN_CUDA
    const char* why = "this process has no GPU to run it on";
#else
    const char* why = "this runtime library was built without CUDA, which it needs";
#endif
    throw Error(std::string(unit.spec.name) + "(): " + why + " (" + unit.spec.target_ids + ")");
  }
  if (unit.spec.packed_threads > 0 && !unit.threads_warned.load(std::memory_order_relaxed)) {
    const std::string message = threads_mismatch(unit.spec, at::get_num_threads(), "at::get_num_threads()");
    if (!message.empty() && !unit.threads_warned.exchange(true)) TORCH_WARN(message);
  }
  return unit.graph->run(inputs);
}

void Package::load_weights(const std::string& path) {
  const std::shared_ptr<const Safetensors> file = Safetensors::open(path);
  std::lock_guard<std::mutex> lock(weights_mutex_);
  std::vector<std::pair<Unit*, Given>> plans;
  std::string names;
  for (auto& unit : units_) {
    if (unit->ready) names += (names.empty() ? "" : ", ") + unit_name(*unit);
  }
  if (names.empty()) {
    throw Error(path + ": no graph of package " + info_.name + " runs in this process, which has no GPU");
  }
  if (WeightsFile::is_one(*file)) {
    std::string other_code;
    for (auto& unit : units_) {
      if (!unit->ready) continue;
      const WeightsFile weights(file, unit_name(*unit));
      if (!weights.holds_unit()) continue;
      if (!weights.layout().empty() && weights.layout() != unit->info.weights_layout) {
        other_code += (other_code.empty() ? "" : ", ") + unit_name(*unit);
        continue;
      }
      Given given;
      for (size_t m = 0; m < unit->graph->num_models(); ++m) {
        auto model = weights.model_weights(unit->graph->model(m).variant, unit->constants[m]);
        if (!model) break;
        given.push_back(std::move(*model));
      }
      if (given.size() == unit->graph->num_models()) plans.emplace_back(unit.get(), std::move(given));
    }
    if (plans.empty() && !other_code.empty()) {
      throw Error(path + " holds weights laid out for other compiled code than this package's (" + other_code +
                  "): it comes from another build, spec or shimgen; load the file of this package's build, or the "
                  "model's state dict");
    }
    if (plans.empty()) {
      throw Error(path + " holds the weights of no graph in this package as it was built (" + names +
                  "): it comes from a build of another model, or with other flags");
    }
  } else {
    for (auto& unit : units_) {
      if (!unit->ready) continue;
      const std::string weights_file =
          *unit->info.weights_file ? unit->info.weights_file : unit_name(*unit) + ".safetensors";
      Given given;
      for (size_t m = 0; m < unit->graph->num_models(); ++m) {
        given.push_back(weights_by_name(*file, unit->constants[m], unit->spec.state, unit->spec.name, weights_file));
      }
      plans.emplace_back(unit.get(), std::move(given));
    }
  }
  for (auto& [unit, given] : plans) give(*unit, given);
}

// ---- where the package is ----

PackagePaths resolve_package(const PackageInfo& info, const std::string& path, const std::string& installed) {
  const std::string name = info.name;
  const std::string takes = name + "::load() takes a weights file, or the prefix the package is installed under";
  if (path.empty()) return {installed, ""};
  struct stat st = {};
  if (stat(path.c_str(), &st) != 0) throw Error(path + ": no such file or directory (" + takes + ")");
  if (!S_ISDIR(st.st_mode)) return {installed, path};
  std::string directory = path.back() == '/' ? path : path + "/";
  if (is_directory(directory + "lib/" + name)) return {directory + "lib/" + name + "/", ""};
  const size_t end = directory.find_last_not_of('/');
  const size_t start = end == std::string::npos ? 0 : directory.rfind('/', end) + 1;
  if (end != std::string::npos && directory.compare(start, end + 1 - start, name) == 0) return {directory, ""};
  throw Error(path + " holds no lib/" + name + "/ (" + takes + ")");
}

std::shared_ptr<Package> open_package(const PackageInfo& info, const std::string& path, const void* address) {
  const std::string beside = directory_of(address);
  const PackagePaths paths = resolve_package(info, path, beside.empty() ? std::string() : beside + info.name + "/");
  if (paths.directory.empty()) {
    throw Error(std::string("cannot tell where lib") + info.name + ".so was loaded from; pass " + info.name +
                "::load() the prefix the package is installed under");
  }
  auto package = std::make_shared<Package>(info, paths.directory);
  std::string weights = paths.weights;
  const char* from_env = *info.weights_env ? std::getenv(info.weights_env) : nullptr;
  if (weights.empty() && from_env && *from_env) weights = from_env;
  if (!weights.empty()) {
    try {
      package->load_weights(weights);
    } catch (const Error& e) {
      if (weights != from_env) throw;
      throw Error(std::string(info.weights_env) + "=" + weights + ": " + e.what());
    }
  }
  return package;
}

}  // namespace shimgen
