// The tensor files of run_graph.cpp and benchmarks/cpp (tensor_file.py is their Python side): a count, then per
// tensor its dtype (c10::ScalarType's number), rank, sizes and contiguous bytes, all integers int64 little-endian.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace tensor_file {

inline int64_t read_int(std::istream& in) {
  int64_t value = 0;
  if (!in.read(reinterpret_cast<char*>(&value), sizeof value)) throw std::runtime_error("truncated tensor file");
  return value;
}

inline std::vector<at::Tensor> read_tensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::vector<at::Tensor> tensors(read_int(in));
  for (at::Tensor& t : tensors) {
    auto dtype = static_cast<c10::ScalarType>(read_int(in));
    std::vector<int64_t> sizes(read_int(in));
    for (int64_t& s : sizes) s = read_int(in);
    t = at::empty(sizes, at::TensorOptions().dtype(dtype));
    if (!in.read(static_cast<char*>(t.data_ptr()), t.nbytes())) throw std::runtime_error("truncated tensor file");
  }
  return tensors;
}

inline void write_tensors(const std::string& path, const std::vector<at::Tensor>& tensors) {
  std::ofstream out(path, std::ios::binary);
  auto write_int = [&](int64_t value) { out.write(reinterpret_cast<const char*>(&value), sizeof value); };
  write_int(tensors.size());
  for (const at::Tensor& output : tensors) {
    at::Tensor t = output.cpu().contiguous();
    write_int(static_cast<int64_t>(t.scalar_type()));
    write_int(t.dim());
    for (int64_t s : t.sizes()) write_int(s);
    out.write(static_cast<const char*>(t.data_ptr()), t.nbytes());
  }
  if (!out) throw std::runtime_error("cannot write " + path);
}

}  // namespace tensor_file
