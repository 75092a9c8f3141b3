// LoRA (nn/lora.h, engine/setup/adapter_state.h): the adapted layer against its formula computed
// with plain tensor operations, PEFT's initialisation and scaling, the merge, which layers
// add_adapters adapts and freezes, the config keys, and a run's checkpoint (the adapters alone,
// the base's identity checked on loading). The numbers against PEFT itself are
// tests/lora_check.py's.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "config/loader.h"
#include "engine_fixture.h"
#include "models/model.h"
#include "nn/lora.h"

namespace trainer::nn {
namespace {

Linear adapted(int64_t in, int64_t out, LoraOptions o, bool bias = true) {
  Linear layer(torch::nn::LinearOptions(in, out).bias(bias));
  layer->add_adapter(o);
  return layer;
}

TEST(Lora, ForwardIsTheBaseplusTheScaledLowRankUpdate) {
  torch::manual_seed(1);
  LoraOptions o;
  o.rank = 3;
  o.alpha = 6.0;
  auto layer = adapted(5, 7, o);
  torch::NoGradGuard no_grad;
  layer->lora_B->weight.normal_();  // B starts at zero: give the update something to add
  const auto x = torch::randn({2, 4, 5});
  const auto& a = layer->lora_A->weight;  // [3, 5]
  const auto& b = layer->lora_B->weight;  // [7, 3]
  const auto expected = torch::matmul(x, layer->weight.t()) + layer->bias +
                        torch::matmul(torch::matmul(x, a.t()), b.t()) * (6.0 / 3.0);
  EXPECT_TRUE(torch::allclose(layer->forward(x), expected, 1e-5, 1e-6));
  // Merging the update into the weight computes the same map.
  const auto merged = torch::linear(x, layer->weight + layer->delta_weight(), layer->bias);
  EXPECT_TRUE(torch::allclose(merged, expected, 1e-5, 1e-6));
}

TEST(Lora, InitialisedAsPeftDoes) {
  torch::manual_seed(2);
  LoraOptions o;
  o.rank = 64;
  auto layer = adapted(400, 30, o);
  const auto& a = layer->lora_A->weight;
  EXPECT_EQ(a.sizes(), (std::vector<int64_t>{64, 400}));
  EXPECT_EQ(layer->lora_B->weight.sizes(), (std::vector<int64_t>{30, 64}));
  EXPECT_EQ(layer->lora_B->weight.abs().max().item<float>(), 0.0f);
  // kaiming_uniform_(a = sqrt(5)): U(-1/sqrt(in), 1/sqrt(in)), standard deviation bound/sqrt(3).
  const double bound = 1.0 / std::sqrt(400.0);
  EXPECT_LE(a.abs().max().item<double>(), bound);
  EXPECT_GT(a.abs().max().item<double>(), 0.99 * bound);
  EXPECT_NEAR(a.std().item<double>(), bound / std::sqrt(3.0), 0.02 * bound);
  // B = 0: the adapted layer starts as the base.
  const auto x = torch::randn({3, 400});
  EXPECT_TRUE(torch::equal(layer->forward(x), torch::linear(x, layer->weight, layer->bias)));
}

TEST(Lora, ScalingIsAlphaOverRankOrOverItsRoot) {
  LoraOptions o;
  o.rank = 16;
  o.alpha = 32.0;
  EXPECT_DOUBLE_EQ(o.scaling(), 2.0);
  o.rslora = true;
  EXPECT_DOUBLE_EQ(o.scaling(), 8.0);
}

TEST(Lora, OnlyTheAdapterGetsGradientsAndDropoutOnlyWhileTraining) {
  torch::manual_seed(3);
  LoraOptions o;
  o.rank = 2;
  o.dropout = 0.5;
  auto layer = adapted(6, 4, o);
  {
    torch::NoGradGuard no_grad;
    layer->lora_B->weight.normal_();
  }
  layer->weight.requires_grad_(false);
  layer->bias.requires_grad_(false);
  const auto x = torch::randn({8, 6});
  layer->eval();
  const auto first = layer->forward(x);
  EXPECT_TRUE(torch::equal(first, layer->forward(x)));
  layer->train();
  const auto dropped = layer->forward(x);
  EXPECT_FALSE(torch::allclose(dropped, first));
  dropped.sum().backward();
  EXPECT_TRUE(layer->lora_A->weight.grad().defined());
  EXPECT_TRUE(layer->lora_B->weight.grad().defined());
  EXPECT_FALSE(layer->weight.grad().defined());
}

TEST(Lora, AFrozenBaseInBFloat16GivesTheUpdateInFloat32) {
  torch::manual_seed(4);
  LoraOptions o;
  o.rank = 2;
  auto layer = adapted(8, 8, o);
  torch::NoGradGuard no_grad;
  layer->lora_B->weight.normal_();
  layer->weight.set_data(layer->weight.to(torch::kBFloat16));
  layer->bias.set_data(layer->bias.to(torch::kBFloat16));
  const auto x = torch::randn({3, 8}).to(torch::kBFloat16);
  const auto y = layer->forward(x);
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  // PEFT: (base(x) + B(A(x.float())) * scaling) cast back to the base's dtype.
  const auto expected = (torch::linear(x, layer->weight, layer->bias).to(torch::kFloat) +
                         torch::linear(torch::linear(x.to(torch::kFloat), layer->lora_A->weight),
                                       layer->lora_B->weight) *
                             o.scaling())
                            .to(torch::kBFloat16);
  EXPECT_TRUE(torch::allclose(y.to(torch::kFloat), expected.to(torch::kFloat), 1e-2, 1e-2));
}

models::Net small_gpt(const std::string& checkpointing = "none") {
  auto cfg = models::default_model_config("gpt");
  cfg.checkpointing = checkpointing;
  cfg.options.set("n_layer", int64_t{2});
  cfg.options.set("n_head", int64_t{2});
  cfg.options.set("n_embd", int64_t{16});
  cfg.options.set("block_size", int64_t{8});
  cfg.options.set("vocab_size", int64_t{40});
  return models::build_model(cfg, models::InputSpec{{8}, 40});
}

TEST(Lora, AddAdaptersAdaptsTheNamedLayersAndFreezesTheRest) {
  torch::manual_seed(5);
  auto net = small_gpt();
  LoraOptions o;
  o.rank = 4;
  const auto layers = add_adapters(*net, {"c_attn", "c_fc"}, o, torch::kBFloat16);
  EXPECT_EQ(layers,
            (std::vector<std::string>{"transformer.h.0.attn.c_attn", "transformer.h.0.mlp.c_fc",
                                      "transformer.h.1.attn.c_attn", "transformer.h.1.mlp.c_fc"}));
  std::set<std::string> trainable;
  for (const auto& p : net->named_parameters()) {
    if (p.value().requires_grad()) {
      trainable.insert(p.key());
      EXPECT_EQ(p.value().scalar_type(), torch::kFloat) << p.key();
    } else {
      EXPECT_EQ(p.value().scalar_type(), torch::kBFloat16) << p.key();
    }
  }
  EXPECT_EQ(trainable.size(), 8u);
  EXPECT_TRUE(trainable.count("transformer.h.1.mlp.c_fc.lora_B.weight"));
  EXPECT_TRUE(trainable.count("transformer.h.0.attn.c_attn.lora_A.weight"));
  for (const auto& name : trainable) EXPECT_TRUE(is_adapter_tensor(name)) << name;
  EXPECT_EQ(adapted_layers(*net).size(), 4u);
  // The model runs with its base in bfloat16 and gets gradients only in the adapters.
  const auto logits = net->forward(torch::randint(0, 40, {2, 8}));
  EXPECT_EQ(logits.scalar_type(), torch::kBFloat16);
  logits.to(torch::kFloat).sum().backward();
  for (const auto& p : net->named_parameters()) {
    EXPECT_EQ(p.value().grad().defined(), trainable.count(p.key()) > 0) << p.key();
  }
}

// The adapters' gradients of a gpt with random B, its blocks recomputed in backward or not.
std::vector<torch::Tensor> adapter_grads(const std::string& checkpointing) {
  torch::manual_seed(6);
  auto net = small_gpt(checkpointing);
  LoraOptions o;
  o.rank = 2;
  add_adapters(*net, {"c_attn", "c_proj", "c_fc"}, o, torch::kFloat);
  {
    torch::NoGradGuard no_grad;
    for (const auto& [name, layer] : adapted_layers(*net)) layer->lora_B->weight.normal_();
  }
  net->forward(torch::randint(0, 40, {2, 8})).pow(2).mean().backward();
  std::vector<torch::Tensor> grads;
  for (const auto& [name, layer] : adapted_layers(*net)) {
    grads.push_back(layer->lora_A->weight.grad());
    grads.push_back(layer->lora_B->weight.grad());
  }
  return grads;
}

TEST(Lora, CheckpointedBlocksGiveTheSameGradients) {
  const auto plain = adapter_grads("none"), recomputed = adapter_grads("blocks");
  ASSERT_EQ(plain.size(), 16u);  // c_attn, attn.c_proj, c_fc, mlp.c_proj of 2 blocks
  ASSERT_EQ(recomputed.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    ASSERT_TRUE(recomputed[i].defined()) << i;
    EXPECT_GT(plain[i].abs().max().item<float>(), 0.0f) << i;
    EXPECT_TRUE(torch::allclose(recomputed[i], plain[i], 1e-5, 1e-7)) << i;
  }
}

TEST(Lora, TargetsThatNameNoLinearLayerAreRefusedBeforeAnythingChanges) {
  auto net = small_gpt();
  LoraOptions o;
  try {
    add_adapters(*net, {"c_attn", "q_proj"}, o, torch::kFloat);
    FAIL() << "no error";
  } catch (const LoraTargetError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("'q_proj' names no module"), std::string::npos) << m;
    EXPECT_NE(m.find("the linear layers are: c_attn, c_fc, c_proj"), std::string::npos) << m;
  }
  try {
    add_adapters(*net, {"wte"}, o, torch::kFloat);
    FAIL() << "no error";
  } catch (const LoraTargetError& e) {
    EXPECT_NE(std::string(e.what()).find("'wte' is not a linear layer"), std::string::npos);
  }
  EXPECT_TRUE(adapted_layers(*net).empty());
  for (const auto& p : net->parameters()) EXPECT_TRUE(p.requires_grad());
  // None named: PEFT's default for GPT-2, c_attn.
  EXPECT_EQ(add_adapters(*net, {}, o, torch::kFloat).size(), 2u);
}

// [all-linear] (PEFT's shorthand, any case): every nn::Linear but the output layer, the module
// of the model's last parameter where that is one (gpt's lm_head is no nn::Linear: none left out).
TEST(Lora, AllLinearAdaptsEveryLinearLayerButTheOutputLayer) {
  auto gpt = small_gpt();
  std::vector<std::string> all;
  for (const auto& item : gpt->named_modules("", false)) {
    if (item.value()->as<LinearImpl>()) all.push_back(item.key());
  }
  EXPECT_EQ(add_adapters(*gpt, {"All-Linear"}, LoraOptions{}, torch::kFloat), all);
  struct Net : torch::nn::Module {
    Linear hidden{register_module("hidden", Linear(torch::nn::LinearOptions(4, 8)))};
    Linear out{register_module("out", Linear(torch::nn::LinearOptions(8, 2)))};
  } net;
  LoraOptions rank2;
  rank2.rank = 2;
  EXPECT_EQ(add_adapters(net, {kAllLinear}, rank2, torch::kFloat),
            std::vector<std::string>{"hidden"});
  EXPECT_FALSE(net.out->adapted());
}

}  // namespace
}  // namespace trainer::nn

namespace trainer::engine {
namespace {

class LoraRun : public EngineTest {
 protected:
  // A 2-block gpt on random tokens with rank-4 adapters on c_attn and c_proj (attention's and
  // the MLP's).
  config::LoadedConfig lora(std::vector<std::string> more = {}) {
    std::vector<std::string> o = {"model.name=gpt",
                                  "model.n_layer=2",
                                  "model.n_head=2",
                                  "model.n_embd=16",
                                  "model.block_size=8",
                                  "model.vocab_size=0",
                                  "data.name=synthetic_tokens",
                                  "data.num_classes=40",
                                  "optim.name=adamw",
                                  "optim.lr=0.01",
                                  "model.lora.rank=4",
                                  "model.lora.alpha=8",
                                  "model.lora.targets=[c_attn, c_proj]"};
    o.insert(o.end(), more.begin(), more.end());
    return load(o);
  }
};

std::map<std::string, torch::Tensor> copies(torch::nn::Module& model) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : model.named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

TEST_F(LoraRun, TrainsTheAdaptersAloneAndCheckpointsThemAlone) {
  const auto loaded = lora();
  Trainer t(loaded);
  const auto before = copies(t.model());
  t.fit();
  int adapters = 0;
  for (const auto& [name, after] : copies(t.model())) {
    const bool adapter = nn::is_adapter_tensor(name);
    adapters += adapter;
    EXPECT_EQ(torch::equal(after, before.at(name)), !adapter) << name;  // B moves off zero
  }
  EXPECT_EQ(adapters, 12);  // c_attn, attn.c_proj and mlp.c_proj of 2 blocks
  const auto state = checkpoint::load(t.last_checkpoint());
  std::set<std::string> model, optim;
  for (const auto& [name, tensor] : state.tensors) {
    if (name.rfind("model.", 0) == 0) model.insert(name.substr(6));
    if (name.rfind("optim.", 0) == 0) optim.insert(name.substr(6, name.rfind('.') - 6));
  }
  EXPECT_EQ(model.size(), 12u);
  for (const auto& name : model) EXPECT_TRUE(nn::is_adapter_tensor(name)) << name;
  EXPECT_EQ(optim, model);  // AdamW's moments of the adapters, nothing of the base
  ASSERT_TRUE(state.meta.contains("lora"));
  EXPECT_EQ(state.meta["lora"]["layers"].size(), 6u);
  EXPECT_EQ(state.meta["lora"]["base"].get<std::string>().size(), 16u);  // xxHash64, hex
}

TEST_F(LoraRun, ResumesTheAdaptersOnTheirBaseAndRefusesAnother) {
  Trainer first(lora());
  first.fit();
  const std::string path = first.last_checkpoint();
  Trainer same(lora({"train.max_steps=8"}));
  ASSERT_TRUE(same.resume(path));
  const auto theirs = copies(first.model());
  for (const auto& [name, mine] : copies(same.model())) {
    EXPECT_TRUE(torch::equal(mine, theirs.at(name))) << name;
  }
  // Another seed draws another base (no model.pretrained): its identity differs.
  Trainer other(lora({"seed=6"}));
  try {
    other.resume(path);
    FAIL() << "resumed on another base";
  } catch (const config::ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("model.pretrained"), std::string::npos) << m;
    EXPECT_NE(m.find("trained on another base"), std::string::npos) << m;
  }
  // A run without LoRA does not load adapters as a model, nor LoRA a whole model.
  Trainer full(load({"model.name=gpt", "model.n_layer=2", "model.n_head=2", "model.n_embd=16",
                     "model.block_size=8", "model.vocab_size=0", "data.name=synthetic_tokens",
                     "data.num_classes=40", "optim.name=adamw", "optim.lr=0.01"}));
  EXPECT_THROW(full.resume(path), config::ConfigError);
}

TEST_F(LoraRun, TargetsNamingNoLinearLayerAreAConfigError) {
  try {
    Trainer t(lora({"model.lora.targets=[c_attn, q_proj]"}));
    FAIL() << "no error";
  } catch (const config::ConfigError& e) {
    ASSERT_EQ(e.issues().size(), 1u);
    EXPECT_EQ(e.issues()[0].key, "model.lora.targets");
    EXPECT_NE(e.issues()[0].message.find("'q_proj' names no module of the model; the linear "
                                         "layers are: c_attn, c_fc, c_proj (model gpt)"),
              std::string::npos)
        << e.issues()[0].message;
  }
}

// model.lora.targets: all-linear, a string as PEFT's target_modules takes it, adapts every linear
// layer (gpt's lm_head is no nn::Linear) and is kept as [all-linear].
TEST_F(LoraRun, AllLinearIsTakenAsAStringOrAList) {
  for (const char* value : {"all-linear", "[all-linear]"}) {
    const auto loaded = lora({std::string("model.lora.targets=") + value});
    EXPECT_EQ(loaded.cfg.model.lora.targets, std::vector<std::string>{"all-linear"}) << value;
    Trainer t(loaded);
    size_t linear = 0;
    for (const auto& item : t.model().named_modules("", false)) {
      linear += item.value()->as<nn::LinearImpl>() != nullptr;
    }
    EXPECT_EQ(nn::adapted_layers(t.model()).size(), linear) << value;
    EXPECT_EQ(linear, 8u);  // 2 blocks of c_attn, c_proj, c_fc, c_proj
  }
}

TEST_F(LoraRun, TheSectionsKeysAreChecked) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"model.lora.rank=-1", "model.lora.rank"},
      {"model.lora.alpha=0", "model.lora.alpha"},
      {"model.lora.dropout=1", "model.lora.dropout"},
      {"model.lora.base_dtype=int8", "model.lora.base_dtype"},
      {"model.lora.targets=[attn.c_attn]", "model.lora.targets"},
      {"model.lora.targets=[all-linear, c_fc]", "model.lora.targets"},
      {"model.lora.rank=0", "model.lora.rank"},    // LoRA off while targets and alpha are set
      {"model.lora.rank=65", "model.lora.rank"}};  // c_attn 16 -> 48, c_proj 64 -> 16 at most
  for (const auto& [setting, key] : bad) {
    try {
      Trainer t(lora({setting}));  // the rank against the layers: when the adapters are added
      ADD_FAILURE() << setting << " accepted";
    } catch (const config::ConfigError& e) {
      ASSERT_FALSE(e.issues().empty());
      EXPECT_EQ(e.issues()[0].key, key) << setting;
    }
  }
}

}  // namespace
}  // namespace trainer::engine
