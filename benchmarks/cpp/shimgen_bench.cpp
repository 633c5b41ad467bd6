// Contender "shimgen C++" of benchmarks/cpp_call.py: a shimgen build's C++ package, linked through pkg-config
// (lib<name>.so), its graph called through the graph's own method.
//
//   shimgen_bench <inputs.bin> <outputs.bin> [--threads N] [--warmup S] [--batch S] [--batches N] [--device D]
//
// Compiled with -DPACKAGE=<name> '-DPACKAGE_HEADER=<name/name.h>' -DGRAPH_METHOD=<graph>; see bench_common.h.
#include <exception>

#include "bench_common.h"
#include PACKAGE_HEADER

int main(int argc, char** argv) {
  try {
    bench::Options options = bench::parse(argc, argv, 1);
    PACKAGE::Package package;  // outlives the calls
    return bench::main_of(options, [&](const std::vector<at::Tensor>& inputs) -> bench::Call {
      package = PACKAGE::load();
      return [&package, &inputs] { return package.GRAPH_METHOD(inputs); };
    });
  } catch (const std::exception& e) {
    return bench::fail("shimgen_bench", e);
  }
}
