#include "distributed/tensor_parallel.h"

#include <torch/torch.h>

#include <stdexcept>
#include <string>

namespace trainer::distributed {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// The group travels through the autograd context as its address.
Group& group_of(AutogradContext* ctx) {
  return *reinterpret_cast<Group*>(ctx->saved_data["group"].toInt());
}

struct CopyToGroup : torch::autograd::Function<CopyToGroup> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Group* group) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    return x.clone();
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto grad = grads[0].contiguous();
    group_of(ctx).all_reduce({grad}, Reduce::sum);
    return {grad, torch::Tensor()};
  }
};

struct ReduceFromGroup : torch::autograd::Function<ReduceFromGroup> {
  static torch::Tensor forward(AutogradContext* /*ctx*/, const torch::Tensor& x, Group* group) {
    auto out = x.contiguous().clone();
    group->all_reduce({out}, Reduce::sum);
    return out;
  }
  static tensor_list backward(AutogradContext* /*ctx*/, tensor_list grads) {
    return {grads[0], torch::Tensor()};
  }
};

}  // namespace

torch::Tensor copy_to_group(const torch::Tensor& x, Group& group) {
  return CopyToGroup::apply(x, &group);
}

torch::Tensor reduce_from_group(const torch::Tensor& x, Group& group) {
  return ReduceFromGroup::apply(x, &group);
}

torch::Tensor shard_of(const torch::Tensor& whole, int64_t dim, int rank, int parts) {
  const int64_t n = whole.size(dim);
  if (parts < 1 || n % parts != 0) {
    throw std::invalid_argument("a dimension of " + std::to_string(n) + " does not split into " +
                                std::to_string(parts) + " equal parts");
  }
  const int64_t each = n / parts;
  return whole.narrow(dim, each * rank, each);
}

}  // namespace trainer::distributed
