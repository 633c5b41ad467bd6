// Headers of every CPU kernel translation unit, precompiled once per toolchain and flag set.
#include <torch/csrc/inductor/cpp_prefix.h>
