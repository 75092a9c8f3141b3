// The built-in models: output shapes, parameter counts, input checks, the registry.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>

#include "models/model.h"

namespace trainer::models {
namespace {

Net build(const std::string& name, config::ModelConfig cfg, std::vector<int64_t> shape,
          int64_t classes) {
  cfg.name = name;
  return build_model(cfg, InputSpec{std::move(shape), classes});
}

TEST(Models, MlpShapesAndParameterCount) {
  config::ModelConfig cfg = default_model_config();
  cfg.options.set("hidden", std::vector<int64_t>{256, 128, 100});
  auto net = build("mlp", cfg, {1, 28, 28}, 10);
  // (784*256 + 256) + (256*128 + 128) + (128*100 + 100) + (100*10 + 10)
  EXPECT_EQ(parameter_count(*net), 247766);
  auto out = net->forward(torch::randn({3, 1, 28, 28}));
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{3, 10}));
}

TEST(Models, MlpWithoutHiddenLayersIsLinear) {
  config::ModelConfig cfg = default_model_config();
  cfg.options.set("hidden", std::vector<int64_t>{});
  auto net = build("mlp", cfg, {5}, 3);
  EXPECT_EQ(parameter_count(*net), 5 * 3 + 3);
}

TEST(Models, LenetShapesAndParameterCount) {
  config::ModelConfig cfg = default_model_config();
  cfg.options.set("channels", std::vector<int64_t>{32, 64});
  cfg.options.set("kernel_size", int64_t{5});
  cfg.options.set("fc_hidden", int64_t{128});
  auto net = build("lenet", cfg, {1, 28, 28}, 10);
  // conv1 1*32*25+32, conv2 32*64*25+64, fc 64*7*7*128+128, head 128*10+10
  EXPECT_EQ(parameter_count(*net), 832 + 51264 + 401536 + 1290);
  auto out = net->forward(torch::randn({2, 1, 28, 28}));
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 10}));
}

// Pooling before a non-decreasing activation, and NHWC convolutions, change neither the outputs
// nor the gradients of the plain order and layout.
TEST(Models, LenetLayoutsAndActivationOrderAgree) {
  for (const std::string activation : {"relu", "tanh", "gelu"}) {
    config::ModelConfig cfg = default_model_config();
    cfg.options.set("activation", activation);
    torch::manual_seed(3);
    auto plain = build("lenet", cfg, {1, 12, 12}, 4);
    cfg.options.set("channels_last", true);
    torch::manual_seed(3);
    auto nhwc = build("lenet", cfg, {1, 12, 12}, 4);
    EXPECT_TRUE(
        nhwc->named_parameters()["conv2.weight"].is_contiguous(torch::MemoryFormat::ChannelsLast));
    plain->eval();
    nhwc->eval();
    const auto x = torch::randn({3, 1, 12, 12});
    const auto a = plain->forward(x), b = nhwc->forward(x);
    EXPECT_TRUE(torch::allclose(a, b, /*rtol=*/1e-5, /*atol=*/1e-6)) << activation;
    // Reference: activation, then pooling, written out.
    auto p = plain->named_parameters();
    auto act = [&](const torch::Tensor& t) { return activate(activation, t); };
    auto y = torch::max_pool2d(act(torch::conv2d(x, p["conv1.weight"], p["conv1.bias"], 1, 2)), 2);
    y = torch::max_pool2d(act(torch::conv2d(y, p["conv2.weight"], p["conv2.bias"], 1, 2)), 2);
    y = torch::linear(act(torch::linear(y.flatten(1), p["fc.weight"], p["fc.bias"])),
                      p["head.weight"], p["head.bias"]);
    EXPECT_TRUE(torch::allclose(a, y, /*rtol=*/1e-5, /*atol=*/1e-6)) << activation;
    a.sum().backward();
    b.sum().backward();
    EXPECT_TRUE(torch::allclose(p["conv1.weight"].grad(),
                                nhwc->named_parameters()["conv1.weight"].grad(), 1e-4, 1e-5))
        << activation;
  }
}

TEST(Models, LenetRejectsFlatSamples) {
  config::ModelConfig cfg = default_model_config();
  try {
    build("lenet", cfg, {64}, 10);
    FAIL() << "expected ModelError";
  } catch (const ModelError& e) {
    EXPECT_EQ(e.key(), "data.shape");
    EXPECT_NE(std::string(e.what()).find("(C, H, W)"), std::string::npos);
  }
}

TEST(Models, DropoutOnlyWhileTraining) {
  config::ModelConfig cfg = default_model_config();
  cfg.options.set("dropout", 0.5);
  auto net = build("mlp", cfg, {16}, 4);
  auto x = torch::randn({8, 16});
  net->eval();
  EXPECT_TRUE(torch::equal(net->forward(x), net->forward(x)));
  net->train();
  EXPECT_FALSE(torch::equal(net->forward(x), net->forward(x)));
}

TEST(Models, SummaryEndsWithParameterLine) {
  config::ModelConfig cfg = default_model_config();
  cfg.options.set("hidden", std::vector<int64_t>{8});
  auto net = build("mlp", cfg, {4}, 2);
  const auto text = summary(*net, "mlp");
  EXPECT_NE(text.find("parameters: 58\n"), std::string::npos) << text;  // 4*8+8 + 8*2+2
  EXPECT_NE(text.find("fc1"), std::string::npos) << text;
}

// The ViT's parameters counted from its layout: patch projection, class token, position
// embedding, per block two layer norms, the fused q/k/v and output projections and the MLP, the
// final norm and the head.
TEST(Models, VitShapesAndParameterCount) {
  config::ModelConfig cfg = default_model_config();
  const int64_t C = 3, side = 32, p = 8, D = 32, depth = 2, M = 4 * D, K = 10;
  cfg.options.set("patch_size", p);
  cfg.options.set("embed_dim", D);
  cfg.options.set("depth", depth);
  cfg.options.set("num_heads", int64_t{2});
  auto net = build("vit", cfg, {C, side, side}, K);
  const int64_t tokens = (side / p) * (side / p) + 1;
  const int64_t block = 2 * 2 * D + (3 * D * D + 3 * D) + (D * D + D) + (D * M + M) + (M * D + D);
  EXPECT_EQ(parameter_count(*net),
            (C * D * p * p + D) + D + tokens * D + depth * block + 2 * D + (D * K + K));
  EXPECT_EQ(net->forward(torch::randn({2, C, side, side})).sizes(), (std::vector<int64_t>{2, K}));
  try {
    build("vit", cfg, {C, 30, 30}, K);  // 30 is not a multiple of the patch
    FAIL() << "expected ModelError";
  } catch (const ModelError& e) {
    EXPECT_EQ(e.key(), "model.patch_size");
  }
}

TEST(Models, RegistryListsBuiltins) {
  const auto names = model_registry().names();
  for (const std::string name : {"lenet", "mlp", "vit"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  }
  EXPECT_THROW(model_registry().get("resnet9000"), UnknownName);
}

}  // namespace
}  // namespace trainer::models
