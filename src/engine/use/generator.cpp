#include "engine/use/generator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <limits>

#include "util/device.h"

namespace trainer::engine {

torch::Tensor sample_next(const torch::Tensor& logits, const SamplingOptions& options,
                          at::Generator& generator) {
  torch::NoGradGuard no_grad;
  auto l = read_to_host(logits.to(torch::kFloat));  // [B, V]
  // Below the smallest normal float a temperature is a denormal, read as 0 where the CPU flushes
  // them (run.flush_denormal): greedy, as at 0.
  if (options.temperature < std::numeric_limits<float>::min()) return l.argmax(/*dim=*/1);
  // Less the row's largest first: a temperature near 0 then sends the others to -inf (the
  // likeliest tokens left, as at 0) instead of every logit to +-inf.
  l = (l - std::get<0>(l.max(/*dim=*/1, /*keepdim=*/true))) / options.temperature;
  const float minus_inf = -std::numeric_limits<float>::infinity();
  if (options.top_k > 0 && options.top_k < l.size(1)) {
    const auto kth = std::get<0>(l.topk(options.top_k, /*dim=*/1)).select(1, -1).unsqueeze(1);
    l = l.masked_fill(l < kth, minus_inf);  // [B, V]
  }
  if (options.top_p < 1.0) {
    auto [sorted, order] = l.sort(/*dim=*/1, /*descending=*/true);  // [B, V] each
    const auto cumulative = sorted.softmax(/*dim=*/1).cumsum(/*dim=*/1);
    auto remove = cumulative > options.top_p;  // [B, V]
    // Shifted right: the token that crosses p stays, as does the likeliest.
    remove = torch::cat({torch::zeros_like(remove.slice(1, 0, 1)), remove.slice(1, 0, -1)}, 1);
    l = l.masked_fill(remove.scatter(/*dim=*/1, order, remove), minus_inf);
  }
  const auto probs = l.softmax(/*dim=*/1);  // [B, V]
  return at::multinomial(probs, /*num_samples=*/1, /*replacement=*/false, generator).squeeze(1);
}

std::vector<int64_t> generate(models::Decoder& decoder, const torch::Tensor& prompt,
                              const SamplingOptions& options, at::Generator& generator,
                              const std::function<void(int64_t)>& on_token) {
  decoder.reset();
  std::vector<int64_t> out;
  torch::Tensor next = prompt;  // [1, T], then [1, 1]
  for (int64_t i = 0; i < options.max_new_tokens; ++i) {
    const auto token = sample_next(decoder.next_logits(next), options, generator);  // [1]
    const int64_t id = token.item<int64_t>();
    out.push_back(id);
    on_token(id);
    if (std::find(options.stop_ids.begin(), options.stop_ids.end(), id) != options.stop_ids.end()) {
      break;
    }
    next = token.view({1, 1}).to(prompt.device());
  }
  return out;
}

}  // namespace trainer::engine
