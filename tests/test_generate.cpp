// Sampling the next token (engine/use/generator.h): temperature, top-k, top-p as Hugging Face's
// generate() applies them, seeds, and the generation loop over a decoder.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>

#include <set>
#include <vector>

#include "engine/use/generator.h"

namespace trainer::engine {
namespace {

// The tokens drawn from `logits` [1, V] `n` times.
std::multiset<int64_t> draws(const torch::Tensor& logits, const SamplingOptions& o, int n) {
  auto gen = at::detail::createCPUGenerator(o.seed);
  std::multiset<int64_t> out;
  for (int i = 0; i < n; ++i) out.insert(sample_next(logits, o, gen).item<int64_t>());
  return out;
}

TEST(Sampling, TemperatureZeroAndTopKOneTakeTheLikeliest) {
  const auto logits = torch::tensor({{0.1f, 2.0f, 1.9f, -1.0f}});  // [1, 4]
  SamplingOptions greedy;
  greedy.temperature = 0;
  EXPECT_EQ(draws(logits, greedy, 20).count(1), 20u);
  SamplingOptions top1;
  top1.top_k = 1;
  EXPECT_EQ(draws(logits, top1, 20).count(1), 20u);
  SamplingOptions top2;
  top2.top_k = 2;
  const auto two = draws(logits, top2, 200);
  EXPECT_EQ(two.count(1) + two.count(2), 200u);
  EXPECT_GT(two.count(2), 50u);  // 1.9 against 2.0: nearly even
}

// Hugging Face's top-p: the likeliest tokens until their probability passes p, the one that
// passes it included.
TEST(Sampling, TopPKeepsTheTokenThatCrossesP) {
  const auto logits = torch::tensor({{0.5f, 0.3f, 0.2f}}).log();  // probabilities 0.5, 0.3, 0.2
  SamplingOptions o;
  o.top_p = 0.6;  // 0.5 < 0.6: token 1 crosses it and stays
  const auto kept = draws(logits, o, 400);
  EXPECT_EQ(kept.count(2), 0u);
  EXPECT_GT(kept.count(1), 100u);
  o.top_p = 0.4;  // the likeliest alone already holds more
  EXPECT_EQ(draws(logits, o, 50).count(0), 50u);
}

TEST(Sampling, TheSameSeedDrawsTheSameTokens) {
  const auto logits = torch::randn({1, 100});
  SamplingOptions o;
  o.seed = 7;
  auto a = at::detail::createCPUGenerator(7), b = at::detail::createCPUGenerator(7),
       c = at::detail::createCPUGenerator(8);
  std::vector<int64_t> x, y, z;
  for (int i = 0; i < 30; ++i) {
    x.push_back(sample_next(logits, o, a).item<int64_t>());
    y.push_back(sample_next(logits, o, b).item<int64_t>());
    z.push_back(sample_next(logits, o, c).item<int64_t>());
  }
  EXPECT_EQ(x, y);
  EXPECT_NE(x, z);
}

// A decoder whose likeliest next token is the last one given plus one (mod its vocabulary).
class CountingDecoder : public models::Decoder {
 public:
  torch::Tensor next_logits(const torch::Tensor& tokens) override {
    const int64_t last = tokens[0][tokens.size(1) - 1].item<int64_t>();
    ++calls;
    return torch::one_hot(torch::tensor({(last + 1) % 10}), 10).to(torch::kFloat) * 10;
  }
  void reset() override { calls = 0; }
  int64_t vocabulary() const override { return 10; }
  int calls = 0;
};

TEST(Generate, StopsAfterTheFirstStopTokenDrawn) {
  CountingDecoder decoder;
  SamplingOptions o;
  o.temperature = 0;
  o.max_new_tokens = 8;
  auto gen = at::detail::createCPUGenerator(0);
  std::vector<int64_t> seen;
  const auto prompt = torch::tensor({{2}});
  // 3, 4, 5, ...: 9 is never drawn, 5 is the third token.
  o.stop_ids = {9, 5};
  auto out = generate(decoder, prompt, o, gen, [&](int64_t id) { seen.push_back(id); });
  EXPECT_EQ(out, (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(seen, out);
  EXPECT_EQ(decoder.calls, 3);
  o.stop_ids.clear();
  out = generate(decoder, prompt, o, gen, [](int64_t) {});
  EXPECT_EQ(out.size(), 8u);
}

}  // namespace
}  // namespace trainer::engine
