// What the C++ contenders of benchmarks/cpp_call.py share: their options, the tensor files the driver writes and reads,
// the clock, and the per-call timing loop. Each program, given its inputs file, loads its model, calls it once and
// prints the CLOCK_MONOTONIC time at which that first result is ready, then times calls and writes the first result.
//
//   <program> [program's own arguments] <inputs.bin> <outputs.bin> [--threads N] [--warmup S] [--batch S]
//             [--batches N] [--device cpu|cuda]
//
// Printed on stdout, one `key value` a line: first_result_ns (steady_clock, CLOCK_MONOTONIC on Linux), load_ns and
// loaded_ns (the same clock when the model's loading begins and ends: the inputs are read before), per_call_ns (the
// median of the timed batches' means), batch_ns (every batch's mean), calls_per_batch. A tensor file holds a count,
// then per tensor its dtype (c10::ScalarType's number), rank, sizes and contiguous bytes, integers int64
// little-endian (the format of examples/cpp/run_graph.cpp). Exit status 1 with the message on stderr on any error.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "tensor_file.h"

namespace bench {

struct Options {
  std::string inputs, outputs;
  int threads = 1;
  double warmup_s = 0.5;  // calls before timing, at least 3
  double batch_s = 0.2;   // about this long a timed batch
  int batches = 7;
  std::string device = "cpu";
};

// argv[first], argv[first + 1]: the tensor files; then the options.
inline Options parse(int argc, char** argv, int first) {
  if (argc < first + 2) throw std::runtime_error("usage: <inputs.bin> <outputs.bin> [--threads N] [--warmup S] ...");
  Options o;
  o.inputs = argv[first];
  o.outputs = argv[first + 1];
  for (int i = first + 2; i + 1 < argc; i += 2) {
    std::string key = argv[i], value = argv[i + 1];
    if (key == "--threads") o.threads = std::stoi(value);
    else if (key == "--warmup") o.warmup_s = std::stod(value);
    else if (key == "--batch") o.batch_s = std::stod(value);
    else if (key == "--batches") o.batches = std::stoi(value);
    else if (key == "--device") o.device = value;
    else throw std::runtime_error("unknown option " + key);
  }
  return o;
}

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The file's tensors (tensor_file.h, beside examples/cpp/run_graph.cpp), on `device`.
inline std::vector<at::Tensor> read_tensors(const std::string& path, const std::string& device) {
  std::vector<at::Tensor> tensors = tensor_file::read_tensors(path);
  if (device != "cpu") {
    for (at::Tensor& t : tensors) t = t.to(at::Device(device));
  }
  return tensors;
}

using tensor_file::write_tensors;

// Waits for the device's work on `outputs` to finish: a copy to the host of one element (nothing on the CPU).
inline void ready(const std::vector<at::Tensor>& outputs) {
  if (!outputs.empty() && outputs[0].device().is_cuda()) outputs[0].reshape(-1).slice(0, 0, 1).cpu();
}

using Call = std::function<std::vector<at::Tensor>()>;

// Warm-up, then `batches` timed batches of about `batch_s` each (each ending with `ready`); prints the figures.
inline void time_calls(const Call& call, const Options& o) {
  int64_t start = now_ns(), warm = 0;
  while (warm < 3 || now_ns() - start < o.warmup_s * 1e9) {
    ready(call());
    ++warm;
  }
  double mean_ns = double(now_ns() - start) / warm;
  int64_t calls = std::max<int64_t>(1, std::min<int64_t>(1000000, int64_t(o.batch_s * 1e9 / mean_ns)));
  std::vector<double> samples;
  for (int b = 0; b < o.batches; ++b) {
    std::vector<at::Tensor> out;
    int64_t t0 = now_ns();
    for (int64_t i = 0; i < calls; ++i) out = call();
    ready(out);
    samples.push_back(double(now_ns() - t0) / calls);
  }
  std::printf("calls_per_batch %lld\nbatch_ns", static_cast<long long>(calls));
  for (double s : samples) std::printf(" %.1f", s);
  std::vector<double> sorted = samples;
  std::sort(sorted.begin(), sorted.end());
  size_t n = sorted.size();
  double median = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
  std::printf("\nper_call_ns %.1f\n", median);
}

// The whole program around `load` (returns the call, bound to the inputs it is given): threads set, inputs read,
// loaded, first call, first_result_ns printed, calls timed, first outputs written.
inline int main_of(const Options& o, const std::function<Call(const std::vector<at::Tensor>&)>& load) {
  at::set_num_threads(o.threads);
  std::vector<at::Tensor> inputs = read_tensors(o.inputs, o.device);
  int64_t load_ns = now_ns();
  Call call = load(inputs);
  int64_t loaded_ns = now_ns();
  std::vector<at::Tensor> first = call();
  ready(first);
  int64_t first_ns = now_ns();
  std::printf("first_result_ns %lld\nload_ns %lld\nloaded_ns %lld\n", static_cast<long long>(first_ns),
              static_cast<long long>(load_ns), static_cast<long long>(loaded_ns));
  std::fflush(stdout);
  time_calls(call, o);
  write_tensors(o.outputs, first);
  std::fflush(stdout);
  return 0;
}

// The program's exit on an error: its message on one stderr line, "<program>: <message>" (c10::Error's without its
// backtrace), exit status 1.
inline int fail(const char* program, const std::exception& e) {
  const auto* error = dynamic_cast<const c10::Error*>(&e);
  std::string message = error ? error->what_without_backtrace() : e.what();
  std::replace(message.begin(), message.end(), '\n', ' ');
  std::fprintf(stderr, "%s: %s\n", program, message.c_str());
  return 1;
}

}  // namespace bench
