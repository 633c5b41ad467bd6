// Runs one graph of a shimgen C++ package on tensors read from a file and writes its outputs, with no Python.
//
//   run_graph <graph> <inputs.bin> <outputs.bin> [--device cuda] [--threads N] [--repeat N] [--reset 1]
//             [--then GRAPH] [--state FILE] [--prefix DIR] [--weights FILE] [--torch-threads N]
//
// --threads N calls the graph from N threads at once; --torch-threads N sets ATen's own threads within a call
// (at::set_num_threads).
// --repeat N calls the graph N times in a row, --then GRAPH calls another graph on the same inputs after them: the
// outputs written are those of the last call (a graph that updates state sees every earlier call's updates).
// --reset 1 puts the state back to its initial values after the repeats (before --then); --state FILE writes the
// state the calls left (Package::state), in the order of their names, which it prints.
//
// Tensor files: tensor_file.h. Exit status: 0, 2 for an input the package refused (std::invalid_argument), 3 for
// any other error (std::runtime_error), 4 where threads disagreed; the message goes to stderr.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include PACKAGE_HEADER
#include "tensor_file.h"

using tensor_file::read_tensors;
using tensor_file::write_tensors;


int main(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: run_graph <graph> <inputs.bin> <outputs.bin> [--device cuda] [--threads N] [--prefix DIR] "
                 "[--weights FILE] [--torch-threads N]\n";
    return 1;
  }
  std::string graph = argv[1], prefix, weights, device = "cpu", then, state;
  int threads = 1, repeat = 1, reset = 0;
  for (int i = 4; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads")) threads = std::stoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--prefix")) prefix = argv[i + 1];
    if (!std::strcmp(argv[i], "--weights")) weights = argv[i + 1];
    if (!std::strcmp(argv[i], "--device")) device = argv[i + 1];
    if (!std::strcmp(argv[i], "--repeat")) repeat = std::stoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--then")) then = argv[i + 1];
    if (!std::strcmp(argv[i], "--reset")) reset = std::stoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--state")) state = argv[i + 1];
    if (!std::strcmp(argv[i], "--torch-threads")) at::set_num_threads(std::stoi(argv[i + 1]));
  }
  try {
    PACKAGE::Package package = PACKAGE::load(prefix);
    if (!weights.empty()) package.load_weights(weights);
    std::vector<at::Tensor> inputs = read_tensors(argv[2]);
    for (at::Tensor& t : inputs) t = t.to(at::Device(device));
#ifdef GRAPH_METHOD  // the graph's own method, where the build names one
#define STRINGIFY(x) #x
#define NAME_OF(x) STRINGIFY(x)
    std::vector<at::Tensor> outputs =
        graph == NAME_OF(GRAPH_METHOD) ? package.GRAPH_METHOD(inputs) : package.run(graph, inputs);
#else
    std::vector<at::Tensor> outputs = package.run(graph, inputs);
#endif
    for (int k = 1; k < repeat; ++k) outputs = package.run(graph, inputs);
    if (reset) package.reset_state();
    if (!then.empty()) outputs = package.run(then, inputs);
    if (!state.empty()) {
      std::vector<at::Tensor> held;
      for (auto& [name, t] : package.state(device == "cuda")) {
        std::cout << name << "\n";
        held.push_back(t);
      }
      write_tensors(state, held);
    }
    // The same package from several threads at once: every thread's outputs equal the first call's.
    std::vector<std::thread> pool;
    std::vector<int> agree(threads, 1);
    for (int k = 1; k < threads; ++k) {
      pool.emplace_back([&, k] {
        try {
          for (int repeat = 0; repeat < 20; ++repeat) {
            std::vector<at::Tensor> again = package.run(graph, inputs);
            for (size_t j = 0; j < again.size(); ++j) agree[k] &= again[j].equal(outputs[j]);
          }
        } catch (const std::exception& e) {
          std::cerr << "thread " << k << ": " << e.what() << "\n";
          agree[k] = 0;
        }
      });
    }
    for (std::thread& t : pool) t.join();
    write_tensors(argv[3], outputs);
    for (int ok : agree) {
      if (!ok) {
        std::cerr << "threads disagree\n";
        return 4;
      }
    }
  } catch (const std::invalid_argument& e) {
    std::cerr << "invalid_argument: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "runtime_error: " << e.what() << "\n";
    return 3;
  }
  return 0;
}
