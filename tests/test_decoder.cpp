// What is written once and serves several callers: the decoder models' shared part
// (models/decoder.h: token-input checks, the tied head, the hidden states), LoRA's merge
// arithmetic (nn/lora.h: the layer's delta_weight and export --merge), and the comparison of a
// tied tensor's names in a Hugging Face folder (engine/setup/hf_pretrained.h: whole loading and
// streaming into parts).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <string>

#include "checkpoint/safetensors.h"
#include "config/issues.h"
#include "config/loader.h"
#include "engine/setup/hf_pretrained.h"
#include "models/decoder.h"
#include "models/model.h"
#include "nn/lora.h"
#include "temp_dir.h"
#include "util/fileio.h"

namespace trainer {
namespace {

config::ModelConfig tiny(const std::string& name) {
  auto cfg = models::default_model_config(name);
  cfg.options.set("n_layer", int64_t{2});
  cfg.options.set("n_head", int64_t{2});
  cfg.options.set("n_embd", int64_t{32});
  cfg.options.set("block_size", int64_t{16});
  cfg.options.set("vocab_size", int64_t{50});
  if (name == "llama") cfg.options.set("intermediate_size", int64_t{64});
  return cfg;
}

// The ModelError building `cfg` on `input` throws: "key: message" ("" when none).
std::string build_error(const config::ModelConfig& cfg, const models::InputSpec& input) {
  try {
    models::build_model(cfg, input);
  } catch (const models::ModelError& e) {
    return e.key() + ": " + e.what();
  }
  return "";
}

// The first line of what `f` throws ("" when nothing).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    const std::string what = e.what();
    return what.substr(0, what.find('\n'));
  }
  return "";
}

// gpt and llama check token data and token ids with one set of checks, naming the model.
TEST(Decoder, TokenInputIsCheckedAlikeByEveryDecoder) {
  for (const std::string name : {"gpt", "llama"}) {
    SCOPED_TRACE(name);
    EXPECT_EQ(build_error(tiny(name), {{17}, 0}),
              "data.seq_len: data.seq_len 17 exceeds model.block_size 16; use 0 to take the block "
              "size");
    EXPECT_EQ(build_error(tiny(name), {{16}, 51}),
              "model.vocab_size: the token data has ids up to 50, beyond model.vocab_size 50; use "
              "0 to take the data's vocabulary");
    auto open = tiny(name);
    open.options.set("vocab_size", int64_t{0});
    EXPECT_EQ(build_error(open, {{16}, 0}),
              "model.vocab_size: " + name + " needs a vocabulary size > 0");
    // vocab_size 0: the data's vocabulary, the logits' width.
    auto net = models::build_model(open, {{16}, 37});
    EXPECT_EQ(net->forward(torch::zeros({1, 4}, torch::kLong)).size(2), 37);
    net = models::build_model(tiny(name), {{16}, 0});
    EXPECT_NE(error_of([&] {
                net->forward(torch::zeros({16}, torch::kLong));
              }).find(name + " expects token ids [B, T]; got 1 dims"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                net->forward(torch::zeros({1, 17}, torch::kLong));
              }).find(name + ": sequence length 17 exceeds block_size 16"),
              std::string::npos);
    EXPECT_NE(error_of([&] {
                net->forward_packed(torch::zeros({1, 8}, torch::kLong),
                                    torch::zeros({1, 7}, torch::kLong));
              }).find(name + ": positions [1, 7] do not match the token ids [1, 8]"),
              std::string::npos);
    // The shared checks alone, as the models call them.
    EXPECT_EQ(models::decoder_vocabulary(name, 0, {{16}, 37}), 37);
    EXPECT_EQ(models::decoder_vocabulary(name, 50, {{16}, 37}), 50);
    EXPECT_NO_THROW(models::check_token_input(16, 0, {{16}, 9999}));
  }
}

// The output layer is the token embedding's tensor when tied, a weight of its own drawn as the
// model's other matrices (N(0, 0.02)) when not; the blocks the model lists are its own.
TEST(Decoder, TheHeadIsTheEmbeddingOnlyWhenTied) {
  const std::map<std::string, std::string> embedding = {{"gpt", "transformer.wte.weight"},
                                                        {"llama", "model.embed_tokens.weight"}};
  for (const std::string name : {"gpt", "llama"}) {
    for (const bool tied : {true, false}) {
      SCOPED_TRACE(name + (tied ? " tied" : " untied"));
      auto cfg = tiny(name);
      cfg.options.set("tie_embeddings", tied);
      torch::manual_seed(3);
      const auto net = models::build_model(cfg, {{16}, 0});
      const auto params = net->named_parameters();
      const auto& wte = params[embedding.at(name)];
      const auto& head = params["lm_head.weight"];
      EXPECT_EQ(wte.data_ptr() == head.data_ptr(), tied);
      EXPECT_EQ(head.sizes(), wte.sizes());
      EXPECT_NEAR(head.std().item<double>(), 0.02, 0.002);
      EXPECT_EQ(net->blocks().size(), 2u);
      EXPECT_EQ(dynamic_cast<models::DecoderImpl&>(*net).vocabulary(), 50);
    }
  }
}

// LoRA's update merged into a weight, computed by one function for the layer and for export
// --merge: scaling times the sum of the rank-one updates B[:, k] A[k, :], in float32.
TEST(LoraMerge, DeltaIsTheScaledSumOfRankOneUpdates) {
  torch::manual_seed(4);
  const auto a = torch::randn({3, 5}).to(torch::kBFloat16);  // [r, in]
  const auto b = torch::randn({7, 3}).to(torch::kBFloat16);  // [out, r]
  const double scaling = 2.5;
  auto expected = torch::zeros({7, 5}, torch::kDouble);
  for (int64_t k = 0; k < 3; ++k) {
    expected += torch::outer(b.select(1, k).to(torch::kDouble), a.select(0, k).to(torch::kDouble));
  }
  expected *= scaling;
  const auto delta = nn::lora_delta(a, b, scaling);
  EXPECT_EQ(delta.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::allclose(delta.to(torch::kDouble), expected, 1e-6, 1e-6));
  // The layer's delta_weight is this function's.
  nn::LoraOptions o;
  o.rank = 3;
  o.alpha = 7.5;  // scaling 2.5
  nn::Linear layer(torch::nn::LinearOptions(5, 7));
  layer->add_adapter(o);
  torch::NoGradGuard no_grad;
  layer->lora_A->weight.copy_(a);
  layer->lora_B->weight.copy_(b);
  EXPECT_TRUE(torch::equal(layer->delta_weight(), delta));
}

// The merged weight: the exact sum of weight and update, rounded once to the weight's dtype (no
// further from it than half a bfloat16 step); shapes that differ are refused, naming both.
TEST(LoraMerge, MergedWeightIsTheSumRoundedOnceToTheWeightsDtype) {
  torch::manual_seed(5);
  const auto weight = torch::randn({7, 5}).to(torch::kBFloat16);
  const auto delta = torch::randn({7, 5}) * 1e-2;
  const auto merged = nn::merge_lora(weight, delta);
  EXPECT_EQ(merged.scalar_type(), torch::kBFloat16);
  const auto exact = weight.to(torch::kDouble) + delta.to(torch::kDouble);
  const auto err = (merged.to(torch::kDouble) - exact).abs();
  EXPECT_TRUE((err <= exact.abs() * std::ldexp(1.0, -8)).all().item<bool>());
  EXPECT_FALSE(torch::equal(merged, weight));
  EXPECT_EQ(error_of([&] {
              nn::merge_lora(weight, torch::zeros({5, 7}));
            }),
            "its update is [5, 7], the weight [7, 5]");
}

// A Hugging Face folder of a tied llama whose two names of the tied tensor hold different values
// is refused alike when it is loaded whole and when it streams into parts, naming the file, both
// names and the key that unties them.
TEST(HfTied, BothWaysOfLoadingRefuseTiedNamesThatDiffer) {
  test_support::TempDir tmp("hf_tied");
  const auto dir = tmp / "tied";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json")
      << R"({"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 64,
            "vocab_size": 50, "max_position_embeddings": 16, "rms_norm_eps": 1e-05,
            "rope_theta": 10000.0, "tie_word_embeddings": true})";
  auto cfg = tiny("llama");
  cfg.options.set("tie_embeddings", true);
  const auto net = models::build_model(cfg, {{16}, 0});
  checkpoint::NamedTensors tensors;
  for (const auto& [name, t] : models::state_dict(*net)) {
    tensors.emplace_back(name, name == "lm_head.weight" ? t + 1 : t.clone());
  }
  const std::string file = (dir / "model.safetensors").string();
  write_atomically(file,
                   [&](const ByteSink& sink) { checkpoint::write_safetensors(tensors, {}, sink); });
  config::LoadedConfig loaded;
  loaded.cfg.model = cfg;
  loaded.cfg.model.pretrained = dir.string();
  engine::apply_hf_folder_config(loaded);  // config.json agrees with cfg
  ASSERT_EQ(loaded.cfg.model.name, "llama");
  const std::string expected =
      file +
      ": lm_head.weight and model.embed_tokens.weight differ, but they are one tensor in "
      "the model (tied); model.tie_embeddings: false gives lm_head a weight of its own";
  const auto whole = error_of([&] { engine::load_hf_folder(*net, loaded); });
  const auto parts = error_of([&] { engine::hf_folder_fill(*net, loaded); });
  EXPECT_NE(whole.find(expected), std::string::npos) << whole;
  EXPECT_NE(parts.find(expected), std::string::npos) << parts;
}

}  // namespace
}  // namespace trainer
