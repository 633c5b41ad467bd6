// Contender "AOTI loader" of benchmarks/cpp_call.py: torch::inductor::AOTIModelPackageLoader (libtorch) on a .pt2 of
// torch._inductor.aoti_compile_and_package, called through loader.run.
//
//   aoti_bench <package.pt2> <inputs.bin> <outputs.bin> [--threads N] [--warmup S] [--batch S] [--batches N]
//              [--device D]
//
// Linked with -ltorch -ltorch_cpu -lc10 of the torch the package was compiled by; see bench_common.h.
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <exception>
#include <memory>
#include <string>

#include "bench_common.h"

int main(int argc, char** argv) {
  try {
    if (argc < 2) throw std::runtime_error("usage: aoti_bench <package.pt2> <inputs.bin> <outputs.bin> ...");
    std::string path = argv[1];
    bench::Options options = bench::parse(argc, argv, 2);
    std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader;  // outlives the calls
    return bench::main_of(options, [&](const std::vector<at::Tensor>& inputs) -> bench::Call {
      loader = std::make_unique<torch::inductor::AOTIModelPackageLoader>(path);
      return [&loader, &inputs] { return loader->run(inputs); };
    });
  } catch (const std::exception& e) {
    return bench::fail("aoti_bench", e);
  }
}
