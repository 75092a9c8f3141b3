// Meta-device kernels for the ATen operators a planned model's step runs (engine::Build::plan)
// that LibTorch registers no C++ meta kernel for (PyTorch has them in Python, as fake tensors'
// decompositions): each computes its outputs' shapes and dtypes, allocating nothing.
#pragma once

namespace trainer::engine {

// Registers the kernels, once per process (later calls do nothing).
void register_meta_kernels();

}  // namespace trainer::engine
