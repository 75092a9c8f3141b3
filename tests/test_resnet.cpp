// The resnet family against torchvision: parameter counts, state-dict names and shapes (from
// tests/data/*_state_dict.tsv, written by scripts/torchvision_reference.py), forward shapes,
// stems, channels_last, zero_init_residual and input checks.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "models/model.h"

namespace trainer::models {
namespace {

Net build(const std::string& name, config::ModelConfig cfg, std::vector<int64_t> shape,
          int64_t classes) {
  cfg.name = name;
  return build_model(cfg, InputSpec{std::move(shape), classes});
}

std::string join_dims(c10::IntArrayRef sizes) {
  std::string out;
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? "," : "") + std::to_string(sizes[i]);
  return out;
}

// `name<TAB>shape` per state-dict entry in torch's order: modules in registration order
// (pre-order), each with its own parameters, then its own buffers.
std::vector<std::string> state_dict_layout(const torch::nn::Module& net) {
  std::vector<std::string> out;
  for (const auto& item : net.named_modules()) {
    const auto prefix = item.key().empty() ? "" : item.key() + ".";
    for (const auto& p : item.value()->named_parameters(/*recurse=*/false)) {
      out.push_back(prefix + p.key() + "\t" + join_dims(p.value().sizes()));
    }
    for (const auto& b : item.value()->named_buffers(/*recurse=*/false)) {
      out.push_back(prefix + b.key() + "\t" + join_dims(b.value().sizes()));
    }
  }
  return out;
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot read " << path;
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

void expect_torchvision_layout(const std::string& name) {
  auto net = build(name, config::ModelConfig{}, {3, 224, 224}, 1000);
  const auto expected =
      read_lines(std::string(TRAINER_SOURCE_DIR) + "/tests/data/" + name + "_state_dict.tsv");
  const auto actual = state_dict_layout(*net);
  ASSERT_FALSE(expected.empty());
  EXPECT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < std::min(actual.size(), expected.size()); ++i) {
    ASSERT_EQ(actual[i], expected[i]) << "entry " << i;
  }
}

TEST(Resnet, ParameterCountsMatchTorchvision) {
  const std::vector<std::pair<std::string, int64_t>> expected = {{"resnet18", 11689512},
                                                                 {"resnet34", 21797672},
                                                                 {"resnet50", 25557032},
                                                                 {"resnet101", 44549160},
                                                                 {"resnet152", 60192808}};
  for (const auto& [name, count] : expected) {
    EXPECT_EQ(parameter_count(*build(name, config::ModelConfig{}, {3, 224, 224}, 1000)), count)
        << name;
  }
}

TEST(Resnet, Resnet18StateDictMatchesTorchvision) {
  expect_torchvision_layout("resnet18");
}

TEST(Resnet, Resnet50StateDictMatchesTorchvision) {
  expect_torchvision_layout("resnet50");
}

TEST(Resnet, ImagenetStemForward) {
  auto net = build("resnet18", config::ModelConfig{}, {3, 64, 64}, 10);
  EXPECT_EQ(net->forward(torch::randn({2, 3, 64, 64})).sizes(), (std::vector<int64_t>{2, 10}));
  auto deep = build("resnet50", config::ModelConfig{}, {3, 64, 64}, 10);
  EXPECT_EQ(deep->forward(torch::randn({2, 3, 64, 64})).sizes(), (std::vector<int64_t>{2, 10}));
}

TEST(Resnet, CifarStemIsThreeByThreeWithoutPooling) {
  config::ModelConfig cfg = default_model_config();
  cfg.options.set("stem", "cifar");
  auto net = build("resnet18", cfg, {3, 32, 32}, 10);
  const auto params = net->named_parameters();
  EXPECT_EQ(params["conv1.weight"].sizes(), (std::vector<int64_t>{64, 3, 3, 3}));
  // Only the kernel differs from the imagenet stem: 64*3*(49-9) fewer weights.
  EXPECT_EQ(
      parameter_count(*net),
      parameter_count(*build("resnet18", config::ModelConfig{}, {3, 32, 32}, 10)) - 64 * 3 * 40);
  EXPECT_EQ(net->forward(torch::randn({2, 3, 32, 32})).sizes(), (std::vector<int64_t>{2, 10}));
}

TEST(Resnet, InputChannelsFromDataOrConfig) {
  auto gray = build("resnet18", config::ModelConfig{}, {1, 28, 28}, 10);
  EXPECT_EQ(gray->named_parameters()["conv1.weight"].size(1), 1);
  EXPECT_EQ(gray->forward(torch::randn({2, 1, 28, 28})).sizes(), (std::vector<int64_t>{2, 10}));

  config::ModelConfig cfg = default_model_config();
  cfg.options.set("in_channels", int64_t{4});
  auto four = build("resnet18", cfg, {3, 32, 32}, 10);
  EXPECT_EQ(four->named_parameters()["conv1.weight"].size(1), 4);
}

TEST(Resnet, ChannelsLastMatchesDefaultFormat) {
  for (const std::string name : {"resnet18", "resnet50"}) {
    config::ModelConfig cfg = default_model_config();
    torch::manual_seed(7);
    auto plain = build(name, cfg, {3, 32, 32}, 10);
    cfg.options.set("channels_last", true);
    torch::manual_seed(7);
    auto nhwc = build(name, cfg, {3, 32, 32}, 10);
    EXPECT_TRUE(
        nhwc->named_parameters()["conv1.weight"].is_contiguous(torch::MemoryFormat::ChannelsLast));
    plain->eval();
    nhwc->eval();
    const auto x = torch::randn({2, 3, 32, 32});
    EXPECT_TRUE(torch::allclose(plain->forward(x), nhwc->forward(x), /*rtol=*/1e-5, /*atol=*/1e-5))
        << name;
  }
}

TEST(Resnet, KaimingInitOnConvolutions) {
  auto net = build("resnet18", config::ModelConfig{}, {3, 224, 224}, 1000);
  const auto params = net->named_parameters();
  // kaiming_normal_(fan_out, relu): std = sqrt(2 / (out_channels * kh * kw)).
  const auto w = params["conv1.weight"];
  EXPECT_NEAR(w.std().item<double>(), std::sqrt(2.0 / (64 * 7 * 7)), 0.05 * 0.0253);
  EXPECT_TRUE(torch::all(params["layer1.0.bn2.weight"] == 1).item<bool>());
  EXPECT_TRUE(torch::all(params["bn1.bias"] == 0).item<bool>());
}

TEST(Resnet, ZeroInitResidualZeroesLastNormOfEachBlock) {
  config::ModelConfig cfg = default_model_config();
  cfg.options.set("zero_init_residual", true);
  const std::vector<std::pair<std::string, std::string>> cases = {{"resnet18", ".bn2.weight"},
                                                                  {"resnet50", ".bn3.weight"}};
  for (const auto& [name, last] : cases) {
    auto net = build(name, cfg, {3, 32, 32}, 10);
    int zeroed = 0;
    for (const auto& p : net->named_parameters()) {
      const auto& key = p.key();
      if (key.rfind("layer", 0) != 0 || key.find("downsample") != std::string::npos) continue;
      const bool is_last =
          key.size() > last.size() && key.compare(key.size() - last.size(), last.size(), last) == 0;
      if (is_last) {
        EXPECT_TRUE(torch::all(p.value() == 0).item<bool>()) << key;
        ++zeroed;
      } else if (key.find(".bn") != std::string::npos && key.find(".weight") != std::string::npos) {
        EXPECT_TRUE(torch::all(p.value() == 1).item<bool>()) << key;
      }
    }
    EXPECT_EQ(zeroed, name == "resnet18" ? 8 : 16) << name;
  }
  // Without the option the same weights are ones.
  auto plain = build("resnet18", config::ModelConfig{}, {3, 32, 32}, 10);
  EXPECT_TRUE(torch::all(plain->named_parameters()["layer4.1.bn2.weight"] == 1).item<bool>());
}

TEST(Resnet, RejectsFlatSamples) {
  try {
    build("resnet18", config::ModelConfig{}, {64}, 10);
    FAIL() << "expected ModelError";
  } catch (const ModelError& e) {
    EXPECT_EQ(e.key(), "data.shape");
    EXPECT_NE(std::string(e.what()).find("(C, H, W)"), std::string::npos);
  }
}

TEST(Resnet, RegistryListsTheFamily) {
  const auto names = model_registry().names();
  for (const std::string name : {"resnet18", "resnet34", "resnet50", "resnet101", "resnet152"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  }
}

}  // namespace
}  // namespace trainer::models
