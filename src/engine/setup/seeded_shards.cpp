#include "engine/setup/seeded_shards.h"

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace trainer::engine {

namespace {

// Where a parameter's values come from: its recorded draw, or the values it was built with.
struct Source {
  std::shared_ptr<const nn::RecordedDraw> draw;  // null: `values` holds them
  std::vector<int64_t> sizes;
  torch::Tensor values;  // [numel], when not drawn again
};

// The last parameter drawn again, whole, for the next range of it.
struct LastDrawn {
  std::string name;
  torch::Tensor values;  // [numel]
};

}  // namespace

ParameterFill replayed_fill(const models::NetImpl& model, nn::RecordedDraws draws) {
  std::map<const void*, std::shared_ptr<const nn::RecordedDraw>> by_tensor;
  for (auto& [tensor, draw] : draws) {
    by_tensor[tensor] = std::make_shared<const nn::RecordedDraw>(std::move(draw));
  }
  auto sources = std::make_shared<std::map<std::string, Source>>();
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : models::state_dict(model)) {  // every name of a tied tensor
    const auto it = by_tensor.find(t.unsafeGetTensorImpl());
    Source s{nullptr, t.sizes().vec(), {}};
    if (it != by_tensor.end()) {
      s.draw = it->second;
    } else {
      s.values = t.detach().reshape({-1}).clone();
    }
    (*sources)[name] = std::move(s);
  }
  auto last = std::make_shared<LastDrawn>();
  return [sources, last](const std::string& name, int64_t first, const torch::Tensor& dst) {
    const Source& s = sources->at(name);
    torch::NoGradGuard no_grad;
    if (s.draw && last->name != name) {
      last->values = torch::Tensor();  // freed before the next one is drawn
      last->values = nn::redraw(*s.draw, s.sizes).reshape({-1});
      last->name = name;
    }
    const auto& whole = s.draw ? last->values : s.values;
    dst.copy_(whole.narrow(0, first, dst.numel()));
  };
}

}  // namespace trainer::engine
