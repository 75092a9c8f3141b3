// Packed rows (data.pack, data::Batch::positions): a row holding several documents computes what
// each document computes in a row of its own, logits and gradients, for llama (grouped-query
// attention, qk_norm, activation checkpointing) and gpt; models that cannot keep documents apart
// say so.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "llama_fixture.h"
#include "models/model.h"

namespace trainer::models {
namespace {

using torch::indexing::Slice;

using test_support::small_llama_config;
constexpr int64_t kVocab = test_support::kLlamaVocab, kContext = test_support::kLlamaContext;

config::ModelConfig gpt_config() {
  config::ModelConfig cfg = default_model_config("gpt");
  cfg.options.set("n_layer", int64_t{2});
  cfg.options.set("n_head", int64_t{4});
  cfg.options.set("n_embd", int64_t{32});
  cfg.options.set("block_size", kContext);
  cfg.options.set("vocab_size", kVocab);
  return cfg;
}

// Every weight N(0, 0.1), every 1-D one (norms, biases) in [0.5, 1.5], so that no part of the
// computation is close to the identity.
Net build(const config::ModelConfig& cfg) {
  torch::manual_seed(7);
  auto net = build_model(cfg, InputSpec{{kContext}, 0});
  torch::NoGradGuard no_grad;
  for (auto& p : net->parameters()) {
    if (p.dim() == 1) {
      p.uniform_(0.5, 1.5);
    } else {
      p.normal_(0.0, 0.1);
    }
  }
  return net;
}

// Documents of random tokens packed into rows of kContext: row 0 holds three and padding, row 1
// two that fill it.
struct Packed {
  torch::Tensor tokens;     // [2, T]
  torch::Tensor positions;  // [2, T]: each token's position within its document
  struct Doc {
    int64_t row, start, length;
    torch::Tensor tokens;  // [1, length]
  };
  std::vector<Doc> docs;
};

Packed pack() {
  torch::manual_seed(11);
  Packed p;
  p.tokens = torch::randint(kVocab, {2, kContext}, torch::kLong);  // the padding random too
  p.positions = torch::zeros({2, kContext}, torch::kLong);
  const std::vector<std::vector<int64_t>> rows = {{7, 5, 6}, {15, 9}};
  for (int64_t r = 0; r < 2; ++r) {
    int64_t at = 0;
    for (const int64_t n : rows[static_cast<size_t>(r)]) {
      p.positions[r].narrow(0, at, n).copy_(torch::arange(n, torch::kLong));
      p.docs.push_back({r, at, n, p.tokens[r].narrow(0, at, n).unsqueeze(0)});
      at += n;
    }
    // Padding: one more document from position 0.
    const int64_t rest = kContext - at;
    p.positions[r].narrow(0, at, rest).copy_(torch::arange(rest, torch::kLong));
  }
  return p;
}

// The sum over documents of their logits weighted by fixed random weights (the padding's left
// out): from the packed rows' logits [2, T, V], or each document's own [1, n, V].
torch::Tensor weighted(const Packed& p, const std::vector<torch::Tensor>& logits, bool packed) {
  torch::manual_seed(13);
  torch::Tensor sum = torch::zeros({});
  for (size_t d = 0; d < p.docs.size(); ++d) {
    const auto& doc = p.docs[d];
    const auto w = torch::randn({doc.length, kVocab});
    const auto y = packed ? logits[0][doc.row].narrow(0, doc.start, doc.length) : logits[d][0];
    sum = sum + (y * w).sum();
  }
  return sum;
}

double relative_gap(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(1.0, b.abs().max().item<double>());
}

// Logits of the packed rows equal each document's alone within 1e-5 (relative to their size);
// the gradients of every parameter too.
void expect_packed_equals_alone(const config::ModelConfig& cfg) {
  const auto p = pack();
  auto packed_net = build(cfg), alone_net = build(cfg);
  ASSERT_TRUE(packed_net->takes_positions());
  const auto packed = packed_net->forward_packed(p.tokens, p.positions);  // [2, T, V]
  std::vector<torch::Tensor> alone;
  for (const auto& doc : p.docs) alone.push_back(alone_net->forward(doc.tokens));  // [1, n, V]
  for (size_t d = 0; d < p.docs.size(); ++d) {
    const auto& doc = p.docs[d];
    const auto y = packed[doc.row].narrow(0, doc.start, doc.length);
    EXPECT_LT(relative_gap(y, alone[d][0]), 1e-5) << "document " << d;
  }
  weighted(p, {packed}, /*packed=*/true).backward();
  weighted(p, alone, /*packed=*/false).backward();
  const auto a = packed_net->named_parameters(), b = alone_net->named_parameters();
  for (const auto& param : a) {
    ASSERT_TRUE(param.value().grad().defined()) << param.key();
    EXPECT_LT(relative_gap(param.value().grad(), b[param.key()].grad()), 1e-5) << param.key();
  }
}

TEST(Packing, LlamaDocumentsComputeAsAlone) {
  expect_packed_equals_alone(small_llama_config());
}

TEST(Packing, LlamaWithQkNormAndBiasesComputesAsAlone) {
  auto cfg = small_llama_config();
  cfg.options.set("qk_norm", true);
  cfg.options.set("qkv_bias", true);
  expect_packed_equals_alone(cfg);
}

TEST(Packing, LlamaWithActivationCheckpointingComputesAsAlone) {
  auto cfg = small_llama_config();
  cfg.options.set("qk_norm", true);
  cfg.checkpointing = "blocks";
  expect_packed_equals_alone(cfg);
}

TEST(Packing, GptDocumentsComputeAsAlone) {
  expect_packed_equals_alone(gpt_config());
}

TEST(Packing, GptWithActivationCheckpointingComputesAsAlone) {
  auto cfg = gpt_config();
  cfg.checkpointing = "blocks";
  expect_packed_equals_alone(cfg);
}

// Without positions forward_packed is forward; a packed row is not one long document (its second
// document's logits differ from those of the same tokens read causally across the boundary).
TEST(Packing, UndefinedPositionsAreTheForwardPass) {
  const auto p = pack();
  auto net = build(small_llama_config());
  torch::NoGradGuard no_grad;
  const auto plain = net->forward(p.tokens);
  EXPECT_TRUE(torch::equal(net->forward_packed(p.tokens, {}), plain));
  const auto packed = net->forward_packed(p.tokens, p.positions);
  const auto& second = p.docs[1];
  EXPECT_GT(relative_gap(packed[0].narrow(0, second.start, second.length),
                         plain[0].narrow(0, second.start, second.length)),
            1e-3);
}

// A model without position handling reports it (key data.pack) rather than mixing documents.
TEST(Packing, ModelsWithoutPositionsRefuseThem) {
  config::ModelConfig cfg = default_model_config("mlp");
  auto net = build_model(cfg, InputSpec{{6}, 3});
  EXPECT_FALSE(net->takes_positions());
  const auto x = torch::randn({2, 6});
  EXPECT_TRUE(torch::equal(net->forward_packed(x, {}), net->forward(x)));
  try {
    net->forward_packed(x, torch::zeros({2, 6}, torch::kLong));
    FAIL() << "positions accepted";
  } catch (const ModelError& e) {
    EXPECT_EQ(e.key(), "data.pack");
  }
}

}  // namespace
}  // namespace trainer::models
