// Reference row "libtorch alone" of benchmarks/cpp_call.py: the floor under both C++ contenders. It links libtorch as
// aoti_bench does, sets the threads and reads the inputs, and its "call" hands the inputs back: what is left of
// start -> first result and of a call once the model is taken away.
//
//   floor_bench <inputs.bin> <outputs.bin> [--threads N] [--warmup S] [--batch S] [--batches N] [--device D]
#include <exception>

#include "bench_common.h"

int main(int argc, char** argv) {
  try {
    bench::Options options = bench::parse(argc, argv, 1);
    return bench::main_of(options, [](const std::vector<at::Tensor>& inputs) -> bench::Call {
      return [&inputs] { return inputs; };
    });
  } catch (const std::exception& e) {
    return bench::fail("floor_bench", e);
  }
}
