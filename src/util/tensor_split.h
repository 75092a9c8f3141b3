// How a tensor splits over the ranks of a tensor-parallel group, in both directions: a rank's
// part of the whole tensor, and the whole tensor from every rank's part. Header-only: the
// torch-free libraries never include it.
#pragma once

#include <ATen/ops/cat.h>
#include <torch/types.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace trainer {

// A split along `dim` into as many equal parts as the group has ranks, made within each of
// `groups` equal blocks along `dim`: groups 1 is a plain split (a column-parallel weight's rows,
// dim 0; a row-parallel weight's columns, dim 1); groups 3 splits a fused query/key/value
// projection's rows so that each rank's part holds its heads' queries, keys and values.
struct TensorSplit {
  int64_t dim = 0;
  int64_t groups = 1;
};

// The size of `split`'s dimension of `shape` when it divides into `parts` x split.groups, else
// a message naming the sizes.
inline std::string split_problem(const std::vector<int64_t>& shape, const TensorSplit& split,
                                 int parts) {
  if (split.dim < 0 || split.dim >= static_cast<int64_t>(shape.size())) {
    return "has no dimension " + std::to_string(split.dim);
  }
  const int64_t n = shape[static_cast<size_t>(split.dim)];
  if (parts >= 1 && n % (parts * split.groups) == 0) return "";
  return "a dimension of " + std::to_string(n) + " does not split into " +
         std::to_string(parts * split.groups) + " equal parts";
}

// Rank `rank` of `parts`' part of `whole` (a view when split.groups is 1). Throws
// std::invalid_argument naming the sizes when the dimension does not divide.
inline torch::Tensor split_part(const torch::Tensor& whole, const TensorSplit& split, int rank,
                                int parts) {
  const std::string problem = split_problem(whole.sizes().vec(), split, parts);
  if (!problem.empty()) throw std::invalid_argument(problem);
  const int64_t block = whole.size(split.dim) / split.groups;
  const int64_t each = block / parts;
  std::vector<torch::Tensor> mine;
  for (int64_t g = 0; g < split.groups; ++g) {
    mine.push_back(whole.narrow(split.dim, g * block + rank * each, each));
  }
  return mine.size() == 1 ? mine[0] : at::cat(mine, split.dim);
}

// The whole tensor from every rank's part, in rank order (split_part's inverse).
inline torch::Tensor join_parts(const std::vector<torch::Tensor>& parts, const TensorSplit& split) {
  if (split.groups == 1) return at::cat(parts, split.dim);
  std::vector<torch::Tensor> pieces;
  for (int64_t g = 0; g < split.groups; ++g) {
    for (const auto& part : parts) {
      const int64_t each = part.size(split.dim) / split.groups;
      pieces.push_back(part.narrow(split.dim, g * each, each));
    }
  }
  return at::cat(pieces, split.dim);
}

}  // namespace trainer
