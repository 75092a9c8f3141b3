// gpt: GPT-2's parameter count, weight tying, shapes, causality, init, and that it learns.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>

#include "config/issues.h"
#include "losses/loss.h"
#include "models/model.h"
#include "nn/aligned_linear.h"
#include "nn/autocast.h"

namespace trainer::models {
namespace {

config::ModelConfig small_config() {
  config::ModelConfig cfg = default_model_config("gpt");
  cfg.options.set("n_layer", int64_t{2});
  cfg.options.set("n_head", int64_t{2});
  cfg.options.set("n_embd", int64_t{32});
  cfg.options.set("block_size", int64_t{16});
  cfg.options.set("vocab_size", int64_t{50});
  cfg.options.set("dropout", 0.0);
  cfg.options.set("bias", true);
  return cfg;
}

Net build_gpt(const config::ModelConfig& cfg) {
  return build_model(cfg, InputSpec{{cfg.options.value<int64_t>("block_size")}, /*num_classes=*/0});
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The output layer of an odd vocabulary: rows 64 elements apart in a padded buffer, the values
// and both gradients those of torch::linear (within rounding), in float32 and under bfloat16
// autocast; the loss writes its gradient over the padded rows in place (no copy of the logits).
TEST(Gpt, AlignedHeadEqualsLinear) {
  torch::manual_seed(0);
  const int64_t c = 48;
  // 8193: past the memory-lean cross-entropy's threshold on the CPU (the gradient written over
  // the padded rows); 1001: ATen's cross_entropy (a gradient of its own).
  for (const auto& [v, autocast] :
       {std::pair<int64_t, bool>{8193, false}, {8193, true}, {1001, false}, {1001, true}}) {
    SCOPED_TRACE(testing::Message() << "V " << v << (autocast ? " bfloat16 autocast" : ""));
    const auto x0 = torch::randn({2, 5, c}), w0 = torch::randn({v, c}) * 0.1;
    auto x1 = x0.clone().requires_grad_(true), w1 = w0.clone().requires_grad_(true);
    auto x2 = x0.clone().requires_grad_(true), w2 = w0.clone().requires_grad_(true);
    torch::Tensor ours, ref;
    {
      nn::AutocastGuard guard(torch::kCPU, torch::kBFloat16, autocast);
      ours = nn::aligned_linear(x1, w1);  // [2, 5, V]
      ref = torch::linear(x2, w2);
    }
    EXPECT_EQ(ours.sizes(), ref.sizes());
    EXPECT_EQ(ours.stride(1), nn::aligned_columns(v));
    EXPECT_EQ(ours.scalar_type(), ref.scalar_type());
    // The same products; the BLAS may block a 64-aligned output differently from an odd one (on
    // some CPUs and thread counts it does), so equal within rounding: float32's, or bfloat16's
    // one unit in the last place (at most 2^-7 relative).
    EXPECT_TRUE(torch::allclose(ours.to(torch::kFloat), ref.to(torch::kFloat),
                                /*rtol=*/autocast ? 1.0 / 128 : 1e-6, /*atol=*/1e-6))
        << (ours.to(torch::kFloat) - ref.to(torch::kFloat)).abs().max().item<double>();
    const auto targets = torch::randint(v, {2, 5});
    auto loss = losses::loss_registry().get("cross_entropy")(config::TrainConfig{});
    const auto data = ours.data_ptr();
    loss(ours, targets).backward();
    EXPECT_EQ(ours.data_ptr(), data);
    if (v > 8192) {  // written in place: the logits now hold the rows' gradients
      EXPECT_FALSE(torch::equal(ours, ref));
    }
    loss(ref, targets).backward();
    const double tol = autocast ? 2e-2 : 1e-6;
    EXPECT_LT((x1.grad() - x2.grad()).abs().max().item<double>(), tol);
    EXPECT_LT((w1.grad() - w2.grad()).abs().max().item<double>(), tol);
    EXPECT_EQ(x1.grad().scalar_type(), torch::kFloat);
    EXPECT_EQ(w1.grad().scalar_type(), torch::kFloat);
  }
  // Logits that another operation saved for its backward (tanh keeps its result): the loss's
  // write over them is caught there, not read as gradients.
  const int64_t v = 8193;
  auto x = torch::randn({4, c}).requires_grad_(true);
  auto w = (torch::randn({v, c}) * 0.1).requires_grad_(true);
  auto capped = torch::tanh(nn::aligned_linear(x, w));
  auto loss = losses::loss_registry().get("cross_entropy")(config::TrainConfig{});
  EXPECT_THROW(loss(capped, torch::randint(v, {4})).backward(), c10::Error);
}

TEST(Gpt, Gpt2SmallParameterCount) {
  config::ModelConfig cfg = default_model_config(
      "gpt");  // defaults: 12 layers, 12 heads, 768 wide, block 1024, vocab 50257
  cfg.options.set("n_layer", int64_t{12});
  cfg.options.set("n_head", int64_t{12});
  cfg.options.set("n_embd", int64_t{768});
  cfg.options.set("block_size", int64_t{1024});
  cfg.options.set("vocab_size", int64_t{50257});
  cfg.options.set("bias", true);
  auto net = build_gpt(cfg);
  // nanoGPT's / Hugging Face's count, the tied lm_head counted once.
  EXPECT_EQ(parameter_count(*net), 124439808);
}

TEST(Gpt, LmHeadIsTiedToTokenEmbedding) {
  auto net = build_gpt(small_config());
  const auto params = net->named_parameters();
  const auto& head = params["lm_head.weight"];
  const auto& wte = params["transformer.wte.weight"];
  EXPECT_TRUE(head.is_same(wte));
  EXPECT_EQ(head.data_ptr(), wte.data_ptr());
  EXPECT_EQ(head.sizes(), (std::vector<int64_t>{50, 32}));
  // LibTorch's parameters() does not deduplicate: the tied tensor is listed twice, and
  // parameter_count() counts it once.
  int64_t listed = 0;
  for (const auto& p : net->parameters()) listed += p.is_same(wte) ? 1 : 0;
  EXPECT_EQ(listed, 2);
  int64_t all = 0;
  for (const auto& p : net->parameters()) all += p.numel();
  EXPECT_EQ(parameter_count(*net), all - wte.numel());
}

// The summary names each submodule by its type as a user reads it: no C++ namespaces (the
// anonymous one included) and no `Impl` suffix.
TEST(Gpt, SummaryNamesSubmodulesReadably) {
  auto net = build_gpt(small_config());
  const auto text = summary(*net, "gpt");
  EXPECT_NE(text.find("  transformer: GptTransformer"), std::string::npos) << text;
  EXPECT_EQ(text.find("anonymous"), std::string::npos) << text;
  EXPECT_EQ(text.find("Impl"), std::string::npos) << text;
}

TEST(Gpt, NanoGptParameterNames) {
  auto net = build_gpt(small_config());
  const auto params = net->named_parameters();
  for (const std::string name :
       {"transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.ln_1.weight",
        "transformer.h.0.ln_1.bias", "transformer.h.0.attn.c_attn.weight",
        "transformer.h.0.attn.c_attn.bias", "transformer.h.0.attn.c_proj.weight",
        "transformer.h.1.ln_2.weight", "transformer.h.1.mlp.c_fc.weight",
        "transformer.h.1.mlp.c_proj.bias", "transformer.ln_f.weight", "transformer.ln_f.bias",
        "lm_head.weight"}) {
    EXPECT_NE(params.find(name), nullptr) << name;
  }
  EXPECT_EQ(params.find("lm_head.bias"), nullptr);
  EXPECT_EQ(params["transformer.h.0.attn.c_attn.weight"].sizes(),
            (std::vector<int64_t>{96, 32}));  // C -> 3C
  EXPECT_EQ(params["transformer.h.0.mlp.c_fc.weight"].sizes(),
            (std::vector<int64_t>{128, 32}));  // C -> 4C
  EXPECT_EQ(params["transformer.wpe.weight"].sizes(), (std::vector<int64_t>{16, 32}));
}

TEST(Gpt, ForwardShape) {
  auto net = build_gpt(small_config());
  auto x = torch::randint(/*high=*/50, {3, 10}, torch::kLong);
  auto out = net->forward(x);
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{3, 10, 50}));
}

TEST(Gpt, FullBlockSizeAccepted) {
  auto net = build_gpt(small_config());
  auto out = net->forward(torch::randint(/*high=*/50, {2, 16}, torch::kLong));
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 16, 50}));
}

TEST(Gpt, Causal) {
  auto net = build_gpt(small_config());
  net->eval();
  auto x = torch::randint(/*high=*/50, {1, 10}, torch::kLong);
  auto y = x.clone();
  y[0][7] = (x[0][7].item<int64_t>() + 1) % 50;
  const auto a = net->forward(x);  // [1, 10, 50]
  const auto b = net->forward(y);
  using torch::indexing::Slice;
  EXPECT_TRUE(torch::allclose(a.index({Slice(), Slice(0, 7)}), b.index({Slice(), Slice(0, 7)}),
                              /*rtol=*/0.0, /*atol=*/1e-6));
  EXPECT_FALSE(torch::allclose(a.index({Slice(), 7}), b.index({Slice(), 7})));
}

TEST(Gpt, WithoutBias) {
  auto cfg = small_config();
  cfg.options.set("bias", false);
  auto net = build_gpt(cfg);
  for (const auto& p : net->named_parameters()) {
    EXPECT_FALSE(ends_with(p.key(), ".bias")) << p.key();
  }
  // wte 50*32 + wpe 16*32 + 2 * (ln_1 32 + c_attn 32*96 + c_proj 32*32 + ln_2 32 + c_fc 32*128
  // + c_proj 128*32) + ln_f 32
  EXPECT_EQ(parameter_count(*net), 1600 + 512 + 2 * (64 + 12 * 32 * 32) + 32);
  EXPECT_EQ(net->forward(torch::randint(/*high=*/50, {2, 5}, torch::kLong)).sizes(),
            (std::vector<int64_t>{2, 5, 50}));
}

TEST(Gpt, RejectsSequenceLongerThanBlockSize) {
  auto net = build_gpt(small_config());
  try {
    net->forward(torch::randint(/*high=*/50, {1, 17}, torch::kLong));
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("17"), std::string::npos) << what;
    EXPECT_NE(what.find("16"), std::string::npos) << what;
  }
}

TEST(Gpt, RejectsHeadsNotDividingWidth) {
  auto cfg = small_config();
  cfg.options.set("n_head", int64_t{5});
  try {
    build_gpt(cfg);
    FAIL() << "expected ModelError";
  } catch (const ModelError& e) {
    EXPECT_EQ(e.key(), "model.n_embd");
  }
}

TEST(Gpt, VocabularyFromInputSpecWhenZero) {
  auto cfg = small_config();
  cfg.options.set("vocab_size", int64_t{0});
  auto net = build_model(cfg, InputSpec{{16}, /*num_classes=*/7});
  EXPECT_EQ(net->forward(torch::randint(/*high=*/7, {1, 4}, torch::kLong)).sizes(),
            (std::vector<int64_t>{1, 4, 7}));
}

TEST(Gpt, DropoutOnlyWhileTraining) {
  auto cfg = small_config();
  cfg.options.set("dropout", 0.2);
  auto net = build_gpt(cfg);
  auto x = torch::randint(/*high=*/50, {2, 12}, torch::kLong);
  net->eval();
  EXPECT_TRUE(torch::equal(net->forward(x), net->forward(x)));
  net->train();
  EXPECT_FALSE(torch::equal(net->forward(x), net->forward(x)));
}

// model.fused_kernels auto on the CPU keeps ATen's operators: the logits and gradients of off,
// bit for bit. A value other than auto, on or off is a config error naming the key.
TEST(Gpt, FusedKernelsOnTheCpuKeepATen) {
  auto cfg = small_config();
  auto plain = build_gpt(cfg);
  cfg.options.set("fused_kernels", "auto");
  auto fused = build_gpt(cfg);
  {
    torch::NoGradGuard no_grad;
    const auto from = plain->parameters(), to = fused->parameters();
    ASSERT_EQ(from.size(), to.size());
    for (size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
  }
  const auto x = torch::randint(/*high=*/50, {2, 9}, torch::kLong);
  const auto want = plain->forward(x), got = fused->forward(x);
  EXPECT_TRUE(torch::equal(got, want));
  want.sum().backward();
  got.sum().backward();
  const auto from = plain->named_parameters(), to = fused->named_parameters();
  for (size_t i = 0; i < from.size(); ++i) {
    EXPECT_TRUE(torch::equal(to[i].value().grad(), from[i].value().grad())) << from[i].key();
  }

  cfg.options.set("fused_kernels", "fast");
  std::vector<config::Issue> issues;
  config::Checks checks(
      "model.", [](const std::string&) { return config::Location{}; }, issues);
  cfg.options.find("gpt")->validate(checks);
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(issues[0].key, "model.fused_kernels");
  EXPECT_NE(issues[0].message.find("must be one of auto"), std::string::npos) << issues[0].message;
}

TEST(Gpt, Gpt2Init) {
  config::ModelConfig cfg = default_model_config("gpt");
  cfg.options.set("n_layer", int64_t{4});
  cfg.options.set("n_head", int64_t{4});
  cfg.options.set("n_embd", int64_t{128});
  cfg.options.set("block_size", int64_t{64});
  cfg.options.set("vocab_size", int64_t{200});
  auto net = build_gpt(cfg);
  const double proj_std = 0.02 / std::sqrt(2.0 * 4);
  int64_t projections = 0;
  for (const auto& p : net->named_parameters()) {
    const auto& name = p.key();
    const auto& t = p.value();
    if (ends_with(name, "c_proj.weight")) {
      ++projections;
      EXPECT_NEAR(t.std().item<double>(), proj_std, 0.1 * proj_std) << name;
    } else if (t.dim() == 2) {  // other Linear and Embedding weights
      EXPECT_NEAR(t.std().item<double>(), 0.02, 0.002) << name;
    } else if (ends_with(name, ".bias")) {
      EXPECT_EQ(t.abs().max().item<double>(), 0.0) << name;
    } else {  // LayerNorm weights
      EXPECT_TRUE(torch::equal(t, torch::ones_like(t))) << name;
    }
    if (t.dim() == 2) EXPECT_NEAR(t.mean().item<double>(), 0.0, 2e-3) << name;
  }
  EXPECT_EQ(projections, 2 * 4);  // attn.c_proj and mlp.c_proj per block
}

TEST(Gpt, LearnsARepeatedSequence) {
  torch::manual_seed(0);
  auto net = build_gpt(small_config());
  net->train();
  const auto pattern = torch::tensor({3, 14, 15, 9, 26, 5}, torch::kLong);
  const auto seq = pattern.repeat({3}).slice(/*dim=*/0, /*start=*/0, /*end=*/17);  // [17]
  const auto x = seq.slice(0, 0, 16).unsqueeze(0).repeat({4, 1});                  // [4, 16]
  const auto y = seq.slice(0, 1, 17).unsqueeze(0).repeat({4, 1});                  // [4, 16]
  torch::optim::AdamW optimizer(unique_parameters(*net), torch::optim::AdamWOptions(1e-2));
  const auto loss_of = [&] {
    const auto logits = net->forward(x);  // [4, 16, 50]
    return torch::cross_entropy_loss(logits.view({-1, 50}), y.view({-1}));
  };
  const double start = loss_of().item<double>();
  EXPECT_NEAR(start, std::log(50.0), 0.5);  // near uniform at init
  for (int step = 0; step < 40; ++step) {
    optimizer.zero_grad();
    auto loss = loss_of();
    loss.backward();
    optimizer.step();
  }
  const double end = loss_of().item<double>();
  EXPECT_LT(end, 0.5 * start) << "start " << start << " end " << end;
}

// Decoding with the key/value cache gives the logits the whole forward pass gives at every
// position (the prompt at once, then token by token), and so does decoding without it; past the
// context the cache keeps the last block_size - 1 tokens, as the forward pass on them does.
TEST(Gpt, DecodingWithTheCacheEqualsTheForwardPass) {
  torch::manual_seed(0);
  auto net = build_gpt(small_config());
  net->eval();
  torch::NoGradGuard no_grad;
  const auto tokens = torch::randint(50, {2, 16}, torch::kLong);  // [B, T], T = block_size
  const auto full = net->forward(tokens);                         // [B, T, V]
  const auto& make = model_registry().get("gpt").decoder;
  ASSERT_TRUE(make);
  for (const bool cache : {true, false}) {
    SCOPED_TRACE(cache ? "cache" : "no cache");
    auto decoder = make(*net, cache);
    EXPECT_EQ(decoder->vocabulary(), 50);
    auto logits = decoder->next_logits(tokens.slice(1, 0, 5));  // [B, V] after 5 tokens
    EXPECT_LT((logits - full.select(1, 4)).abs().max().item<double>(), 1e-5);
    for (int64_t t = 5; t < 16; ++t) {
      logits = decoder->next_logits(tokens.slice(1, t, t + 1));
      EXPECT_LT((logits - full.select(1, t)).abs().max().item<double>(), 1e-5) << t;
    }
    // One more token: the sequence keeps its last 15 (cache) or 16 (no cache) tokens.
    const auto extra = torch::randint(50, {2, 1}, torch::kLong);
    const auto all = torch::cat({tokens, extra}, 1);  // [B, 17]
    const int64_t kept = cache ? 15 : 16;
    const auto expected = net->forward(all.slice(1, 17 - kept)).select(1, kept - 1);
    EXPECT_LT((decoder->next_logits(extra) - expected).abs().max().item<double>(), 1e-5);
    decoder->reset();
    EXPECT_LT((decoder->next_logits(tokens.slice(1, 0, 3)) - full.select(1, 2))
                  .abs()
                  .max()
                  .item<double>(),
              1e-5);
  }
}

// Models that are not language models have no decoder.
TEST(Gpt, OnlyLanguageModelsDecode) {
  EXPECT_FALSE(model_registry().get("mlp").decoder);
  EXPECT_FALSE(model_registry().get("resnet18").decoder);
}

}  // namespace
}  // namespace trainer::models
