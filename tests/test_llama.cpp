// llama: Hugging Face's parameter names and shapes, tying, grouped-query attention against its
// repeated-head equivalent, causality, activation checkpointing, bfloat16 autocast, key/value-cache
// decoding and the tensor-parallel size checks. Its numbers against transformers' are
// tests/llama_check.py's.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "llama_fixture.h"
#include "models/model.h"
#include "nn/autocast.h"

namespace trainer::models {
namespace {

using test_support::small_llama_config;
constexpr int64_t kVocab = test_support::kLlamaVocab, kContext = test_support::kLlamaContext;

Net build(const config::ModelConfig& cfg) {
  return build_model(cfg, InputSpec{{cfg.options.value<int64_t>("block_size")}, 0});
}

// Every weight of `net` N(0, 0.1) and every RMSNorm weight around 1, so that no part of the
// computation is close to the identity.
void randomize(NetImpl& net) {
  torch::NoGradGuard no_grad;
  for (auto& p : net.parameters()) {
    if (p.dim() == 1) {
      p.uniform_(0.5, 1.5);
    } else {
      p.normal_(0.0, 0.1);
    }
  }
}

TEST(Llama, HuggingFaceNamesAndShapes) {
  auto cfg = small_llama_config();
  cfg.options.set("qkv_bias", true);
  cfg.options.set("qk_norm", true);
  auto net = build(cfg);
  const auto params = net->named_parameters();
  const std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {
      {"model.embed_tokens.weight", {kVocab, 32}},
      {"model.layers.0.input_layernorm.weight", {32}},
      {"model.layers.0.self_attn.q_proj.weight", {48, 32}},
      {"model.layers.0.self_attn.q_proj.bias", {48}},
      {"model.layers.0.self_attn.k_proj.weight", {24, 32}},
      {"model.layers.0.self_attn.k_proj.bias", {24}},
      {"model.layers.0.self_attn.v_proj.weight", {24, 32}},
      {"model.layers.0.self_attn.v_proj.bias", {24}},
      {"model.layers.0.self_attn.o_proj.weight", {32, 48}},
      {"model.layers.0.self_attn.q_norm.weight", {12}},
      {"model.layers.0.self_attn.k_norm.weight", {12}},
      {"model.layers.0.post_attention_layernorm.weight", {32}},
      {"model.layers.1.mlp.gate_proj.weight", {48, 32}},
      {"model.layers.1.mlp.up_proj.weight", {48, 32}},
      {"model.layers.1.mlp.down_proj.weight", {32, 48}},
      {"model.norm.weight", {32}},
      {"lm_head.weight", {kVocab, 32}}};
  for (const auto& [name, shape] : expected) {
    const auto* p = params.find(name);
    ASSERT_NE(p, nullptr) << name;
    EXPECT_EQ(p->sizes(), shape) << name;
  }
  // 14 per block (with biases and q/k norms), the embedding, the final norm, the head.
  EXPECT_EQ(params.size(), 2u * 14u + 3u);
  EXPECT_EQ(params.find("model.layers.0.self_attn.o_proj.bias"), nullptr);
  EXPECT_FALSE(params["lm_head.weight"].is_same(params["model.embed_tokens.weight"]));
  // Without the options: no biases, no q/k norms.
  const auto plain = build(small_llama_config())->named_parameters();
  EXPECT_EQ(plain.find("model.layers.0.self_attn.q_proj.bias"), nullptr);
  EXPECT_EQ(plain.find("model.layers.0.self_attn.q_norm.weight"), nullptr);
}

TEST(Llama, TiedHeadIsTheEmbedding) {
  auto cfg = small_llama_config();
  cfg.options.set("tie_embeddings", true);
  auto net = build(cfg);
  const auto params = net->named_parameters();
  EXPECT_TRUE(params["lm_head.weight"].is_same(params["model.embed_tokens.weight"]));
  int64_t all = 0;
  for (const auto& p : net->parameters()) all += p.numel();
  EXPECT_EQ(parameter_count(*net), all - kVocab * 32);
  // A Hugging Face file of a tied model lacks lm_head.weight: it loads, the head from the
  // embedding.
  NamedWeights file;
  for (const auto& [name, t] : state_dict(*net)) {
    if (name != "lm_head.weight") file.emplace_back(name, torch::randn_like(t));
  }
  auto other = build(cfg);
  EXPECT_EQ(load_weights(*other, to_trainer_layout("llama", file), false), "");
  for (const auto& [name, t] : file) {
    EXPECT_TRUE(torch::equal(other->named_parameters()[name], t)) << name;
  }
  EXPECT_TRUE(torch::equal(other->named_parameters()["lm_head.weight"], file[0].second));
}

// Two query heads per key/value head: the logits of a model whose key/value heads are repeated
// (n_kv_head = n_head, each k/v row block copied to the query heads of its group).
TEST(Llama, GroupedQueryAttentionEqualsRepeatedHeads) {
  torch::manual_seed(0);
  auto grouped = build(small_llama_config());
  randomize(*grouped);
  auto cfg = small_llama_config();
  cfg.options.set("n_kv_head", int64_t{4});
  auto repeated = build(cfg);
  NamedWeights weights;
  for (const auto& [name, t] : state_dict(*grouped)) {
    const bool kv =
        name.find("k_proj") != std::string::npos || name.find("v_proj") != std::string::npos;
    // [2 * 12, C] -> [2, 1, 12, C] -> [2, 2, 12, C] -> [4 * 12, C]: heads 0, 0, 1, 1.
    weights.emplace_back(name,
                         kv ? t.view({2, 1, 12, -1}).expand({2, 2, 12, 32}).reshape({48, 32}) : t);
  }
  ASSERT_EQ(load_weights(*repeated, weights, false), "");
  grouped->eval();
  repeated->eval();
  torch::NoGradGuard no_grad;
  const auto x = torch::randint(kVocab, {3, kContext}, torch::kLong);
  const auto a = grouped->forward(x), b = repeated->forward(x);  // [3, T, V]
  EXPECT_LT((a - b).abs().max().item<double>(), 1e-5 * b.abs().max().item<double>());
}

TEST(Llama, Causal) {
  torch::manual_seed(1);
  auto net = build(small_llama_config());
  randomize(*net);
  net->eval();
  torch::NoGradGuard no_grad;
  const auto x = torch::randint(kVocab, {1, 12}, torch::kLong);
  auto y = x.clone();
  y[0][7] = (x[0][7].item<int64_t>() + 1) % kVocab;
  const auto a = net->forward(x), b = net->forward(y);  // [1, 12, V]
  using torch::indexing::Slice;
  EXPECT_TRUE(torch::allclose(a.index({Slice(), Slice(0, 7)}), b.index({Slice(), Slice(0, 7)}),
                              /*rtol=*/0.0, /*atol=*/1e-6));
  EXPECT_FALSE(torch::allclose(a.index({Slice(), 7}), b.index({Slice(), 7})));
}

// The gradients of every parameter with model.checkpointing blocks equal those without.
TEST(Llama, CheckpointingGivesTheSameGradients) {
  torch::manual_seed(2);
  auto cfg = small_llama_config();
  cfg.options.set("qk_norm", true);
  cfg.options.set("qkv_bias", true);
  auto plain = build(cfg);
  randomize(*plain);
  cfg.checkpointing = "blocks";
  auto checkpointed = build(cfg);
  ASSERT_EQ(load_weights(*checkpointed, state_dict(*plain), false), "");
  const auto x = torch::randint(kVocab, {2, kContext}, torch::kLong);
  const auto y = torch::randint(kVocab, {2 * kContext}, torch::kLong);
  for (auto* net : {plain.get(), checkpointed.get()}) {
    torch::cross_entropy_loss(net->forward(x).view({-1, kVocab}), y).backward();
  }
  const auto a = plain->named_parameters(), b = checkpointed->named_parameters();
  for (const auto& p : a) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    const auto& other = b[p.key()].grad();
    ASSERT_TRUE(other.defined()) << p.key();
    EXPECT_LT((p.value().grad() - other).abs().max().item<double>(),
              1e-6 * std::max(1.0, p.value().grad().abs().max().item<double>()))
        << p.key();
  }
}

// Under bfloat16 autocast: bfloat16 logits near float32's, float32 gradients.
TEST(Llama, BFloat16Autocast) {
  torch::manual_seed(3);
  auto cfg = small_llama_config();
  cfg.options.set("qk_norm", true);
  auto net = build(cfg);
  randomize(*net);
  const auto x = torch::randint(kVocab, {2, kContext}, torch::kLong);
  const auto reference = net->forward(x).detach();
  torch::Tensor logits;
  {
    nn::AutocastGuard guard(torch::kCPU, torch::kBFloat16);
    logits = net->forward(x);  // [2, T, V]
  }
  EXPECT_EQ(logits.scalar_type(), torch::kBFloat16);
  const double scale = reference.abs().max().item<double>();
  EXPECT_LT((logits.to(torch::kFloat) - reference).abs().max().item<double>(), 0.05 * scale);
  logits.to(torch::kFloat).sum().backward();
  for (const auto& p : net->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_EQ(p.value().grad().scalar_type(), torch::kFloat) << p.key();
    EXPECT_TRUE(torch::isfinite(p.value().grad()).all().item<bool>()) << p.key();
  }
}

// Decoding with the key/value cache gives the logits of the whole forward pass at every position
// (the prompt at once, then token by token), and so does decoding without it; past the context
// the cache keeps the last block_size - 1 tokens, as the forward pass on them does.
TEST(Llama, DecodingWithTheCacheEqualsTheForwardPass) {
  torch::manual_seed(4);
  auto cfg = small_llama_config();
  cfg.options.set("qk_norm", true);
  cfg.options.set("qkv_bias", true);
  auto net = build(cfg);
  randomize(*net);
  net->eval();
  torch::NoGradGuard no_grad;
  const auto tokens = torch::randint(kVocab, {2, kContext}, torch::kLong);  // [B, T]
  const auto full = net->forward(tokens);                                   // [B, T, V]
  const double tol = 1e-5 * full.abs().max().item<double>();
  const auto& make = model_registry().get("llama").decoder;
  ASSERT_TRUE(make);
  for (const bool cache : {true, false}) {
    SCOPED_TRACE(cache ? "cache" : "no cache");
    auto decoder = make(*net, cache);
    EXPECT_EQ(decoder->vocabulary(), kVocab);
    auto logits = decoder->next_logits(tokens.slice(1, 0, 5));  // [B, V] after 5 tokens
    EXPECT_LT((logits - full.select(1, 4)).abs().max().item<double>(), tol);
    for (int64_t t = 5; t < kContext; ++t) {
      logits = decoder->next_logits(tokens.slice(1, t, t + 1));
      EXPECT_LT((logits - full.select(1, t)).abs().max().item<double>(), tol) << t;
    }
    const auto extra = torch::randint(kVocab, {2, 1}, torch::kLong);
    const auto all = torch::cat({tokens, extra}, 1);  // [B, T + 1]
    const int64_t kept = cache ? kContext - 1 : kContext;
    const auto expected = net->forward(all.slice(1, kContext + 1 - kept)).select(1, kept - 1);
    EXPECT_LT((decoder->next_logits(extra) - expected).abs().max().item<double>(), tol);
  }
}

// A group that only reports its size: enough for split_over's checks, which run before any
// collective.
class SizeOnly final : public nn::TensorParallel {
 public:
  explicit SizeOnly(int size) : size_(size) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  torch::Tensor copy_in(const torch::Tensor& x) override { return x; }
  torch::Tensor reduce_out(const torch::Tensor& x) override { return x; }
  torch::Tensor embedding(const torch::Tensor& ids, const torch::Tensor& weight) override {
    return torch::embedding(weight, ids);
  }

 private:
  int size_;
};

TEST(Llama, TensorParallelSizeMustDivideBothHeadCounts) {
  auto cfg = small_llama_config();  // 4 query heads, 2 key/value heads
  try {
    build(cfg)->split_over(std::make_shared<SizeOnly>(4));
    FAIL() << "expected ModelError";
  } catch (const ModelError& e) {
    EXPECT_EQ(e.key(), "dist.tp_size");
    const std::string what = e.what();
    EXPECT_NE(what.find("model.n_head 4"), std::string::npos) << what;
    EXPECT_NE(what.find("model.n_kv_head 2"), std::string::npos) << what;
  }
  // Rank 0 of 2 keeps its query and key/value heads' rows, half the MLP and of the vocabulary.
  cfg.options.set("vocab_size", int64_t{62});
  auto net = build(cfg);
  const auto whole =
      net->named_parameters().find("model.layers.0.self_attn.k_proj.weight")->clone();
  const auto plan = net->split_over(std::make_shared<SizeOnly>(2));
  const auto params = net->named_parameters();
  EXPECT_EQ(params["model.layers.0.self_attn.q_proj.weight"].sizes(),
            (std::vector<int64_t>{24, 32}));
  EXPECT_TRUE(
      torch::equal(params["model.layers.0.self_attn.k_proj.weight"], whole.slice(0, 0, 12)));
  EXPECT_EQ(params["model.layers.0.self_attn.o_proj.weight"].sizes(),
            (std::vector<int64_t>{32, 24}));
  EXPECT_EQ(params["model.layers.1.mlp.down_proj.weight"].sizes(), (std::vector<int64_t>{32, 24}));
  EXPECT_EQ(params["lm_head.weight"].sizes(), (std::vector<int64_t>{31, 32}));
  EXPECT_EQ(params["model.norm.weight"].sizes(), (std::vector<int64_t>{32}));
  EXPECT_EQ(plan.count("model.layers.1.self_attn.v_proj.weight"), 1u);
}

TEST(Llama, RejectsWhatItCannotBuild) {
  const auto expect_error = [](config::ModelConfig cfg, const std::string& key) {
    try {
      build(cfg);
      FAIL() << "expected ModelError on " << key;
    } catch (const ModelError& e) {
      EXPECT_EQ(e.key(), key);
    }
  };
  auto odd = small_llama_config();
  odd.options.set("head_dim", int64_t{0});
  odd.options.set("n_embd", int64_t{30});  // 30 / 4 heads
  expect_error(odd, "model.head_dim");
  auto kv = small_llama_config();
  kv.options.set("n_kv_head", int64_t{3});
  expect_error(kv, "model.n_kv_head");
  auto net = build(small_llama_config());
  EXPECT_THROW(net->forward(torch::zeros({1, kContext + 1}, torch::kLong)), c10::Error);
}

}  // namespace
}  // namespace trainer::models
