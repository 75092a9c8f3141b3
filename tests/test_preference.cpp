// The preference losses (losses/preference.h) against TRL 1.16 itself: tests/preference_check.py
// runs DPOTrainer._compute_loss, CPOTrainer's and ORPOTrainer's get_batch_loss_metrics on tiny
// stand-in models and writes their inputs, losses, gradients and metrics; each case here computes
// the same from the same weights. And sequence_logps against log_softmax.
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "engine/measure/memory.h"
#include "engine/measure/op_count.h"
#include "losses/preference.h"
#include "temp_dir.h"

namespace trainer::losses {
namespace {

namespace fs = std::filesystem;

// 1e-6 relative (of the larger of |want| and 1 for values near zero, whose float32 rounding is
// absolute): TRL and this code differ only in the order of float32 sums.
constexpr double kRel = 1e-6;

struct Case {
  std::map<std::string, torch::Tensor> tensors;
  std::map<std::string, double> metrics;
  std::map<std::string, std::string> options;
};

std::map<std::string, std::string> key_values(const fs::path& file) {
  std::map<std::string, std::string> out;
  std::ifstream in(file);
  std::string key, value;
  while (in >> key >> value) out[key] = value;
  return out;
}

Case read_case(const fs::path& dir) {
  Case c;
  std::ifstream index(dir / "index.txt");
  std::string line;
  while (std::getline(index, line)) {
    std::istringstream words(line);
    std::string name, dtype;
    words >> name >> dtype;
    std::vector<int64_t> shape;
    for (int64_t d; words >> d;) shape.push_back(d);
    const auto type = dtype == "int64" ? torch::kLong : torch::kFloat;
    auto t = torch::empty(shape, type);
    std::ifstream bin(dir / (name + ".bin"), std::ios::binary);
    bin.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
    EXPECT_TRUE(bin.good()) << dir / (name + ".bin");
    c.tensors[name] = t;
  }
  for (const auto& [k, v] : key_values(dir / "metrics.txt")) c.metrics[k] = std::stod(v);
  c.options = key_values(dir / "options.txt");
  return c;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

PreferenceOptions options_of(const Case& c) {
  PreferenceOptions o;
  o.types.clear();
  for (const auto& name : split(c.options.at("loss_type"))) {
    o.types.push_back(parse_preference_loss(name));
  }
  for (const auto& w : split(c.options.at("loss_weights"))) o.weights.push_back(std::stod(w));
  o.beta = std::stod(c.options.at("beta"));
  o.label_smoothing = std::stod(c.options.at("label_smoothing"));
  if (c.options.count("simpo_gamma")) o.simpo_gamma = std::stod(c.options.at("simpo_gamma"));
  if (c.options.count("cpo_alpha")) o.cpo_alpha = std::stod(c.options.at("cpo_alpha"));
  return o;
}

void expect_close(const torch::Tensor& got, const torch::Tensor& want, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const auto g = got.detach().to(torch::kDouble), w = want.to(torch::kDouble);
  const double scale = std::max(1.0, w.abs().max().item<double>());
  const double err = (g - w).abs().max().item<double>();
  EXPECT_LE(err, kRel * scale) << what << ": max difference " << err << " at scale " << scale
                               << "\n got " << g << "\n want " << w;
}

// The case's loss, its gradients (to the head's weights and hidden states, and to the summed
// log-probabilities) and every metric TRL logged, computed here from the same weights.
void check_case(const fs::path& dir, const std::string& name) {
  SCOPED_TRACE("case " + name);
  const Case c = read_case(dir / name);
  const auto& t = c.tensors;
  const auto h = t.at("policy_H").clone().requires_grad_(true);
  const auto w = t.at("policy_W").clone().requires_grad_(true);
  const auto b = t.at("policy_b").clone().requires_grad_(true);
  const auto logits = torch::matmul(h, w.t()) + b;
  const auto full = t.count("full_labels") ? t.at("full_labels") : torch::Tensor();
  PreferenceInputs in;
  in.policy = sequence_logps(logits, t.at("labels"), full);
  if (t.count("reference_H")) {
    torch::NoGradGuard no_grad;
    const auto ref_logits =
        torch::matmul(t.at("reference_H"), t.at("reference_W").t()) + t.at("reference_b");
    in.reference = sequence_logps(ref_logits, t.at("labels"), {}, {/*stats=*/false}).logps;
  }
  const auto result = preference_loss(in, options_of(c));
  expect_close(result.loss.reshape({1}), t.at("loss"), name + " loss");
  const auto logps_grad =
      torch::autograd::grad({result.loss}, {in.policy.logps}, {}, /*retain_graph=*/true)[0];
  expect_close(logps_grad, t.at("logps_grad"), name + " d loss / d logps");
  result.loss.backward();
  expect_close(h.grad(), t.at("grad_H"), name + " d loss / d H");
  expect_close(w.grad(), t.at("grad_W"), name + " d loss / d W");
  expect_close(b.grad(), t.at("grad_b"), name + " d loss / d b");
  std::set<std::string> ours;
  for (const auto& [key, value] : result.metrics.named()) {
    ours.insert(key);
    ASSERT_TRUE(c.metrics.count(key)) << name << ": TRL does not log " << key;
    EXPECT_FALSE(value.requires_grad()) << key;
    expect_close(value.to(torch::kDouble), torch::tensor(c.metrics.at(key), torch::kDouble),
                 name + " " + key);
  }
  for (const auto& [key, value] : c.metrics) {
    EXPECT_TRUE(ours.count(key)) << name << ": TRL logs " << key << ", not computed";
  }
}

// tests/preference_check.py runs TRL once (a few seconds of imports) for every case: sigmoid,
// ipo (a pair with an empty prompt, where TRL's IPO length counts the first token), hinge, robust,
// a weighted mix, simpo alone and with its NLL and smoothing, orpo.
TEST(Preference, LossesGradientsAndMetricsMatchTrl) {
  const fs::path python = fs::path(TRAINER_VENV_DIR) / "bin" / "python";
  if (!fs::exists(python)) GTEST_SKIP() << "no " << python;
  test_support::TempDir dir("preference");
  const std::string cmd = "'" + python.string() + "' '" + TRAINER_SOURCE_DIR +
                          "/tests/preference_check.py' '" + dir.path().string() + "' > '" +
                          (dir / "log.txt").string() + "' 2>&1";
  const int status = std::system(cmd.c_str());
  const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (rc == 77) GTEST_SKIP() << "trl is not installed in " << TRAINER_VENV_DIR;
  std::ifstream log(dir / "log.txt");
  ASSERT_EQ(rc, 0) << "preference_check.py failed:\n" << log.rdbuf();
  std::ifstream cases(dir / "cases.txt");
  std::set<std::string> seen;
  for (std::string name; cases >> name;) {
    check_case(dir.path(), name);
    seen.insert(name);
  }
  for (const char* name :
       {"sigmoid", "ipo", "hinge", "robust", "mix", "simpo", "simpo_nll", "orpo"}) {
    EXPECT_TRUE(seen.count(name)) << "no case " << name;
  }
}

// sequence_logps against log_softmax over the whole batch in float32, in blocks of every size,
// from float32 and bfloat16 logits: sums, counts, statistics and the logits' gradient.
TEST(Preference, SequenceLogpsMatchLogSoftmax) {
  torch::manual_seed(7);
  const int64_t B = 4, T = 9, V = 33;
  auto labels = torch::randint(0, V, {B, T}, torch::kLong);
  labels.index_put_({torch::indexing::Slice(), torch::indexing::Slice(0, 3)}, -100);
  labels.index_put_({1, torch::indexing::Slice(6)}, -100);
  auto full = labels.clone();
  full.index_put_({torch::indexing::Slice(), torch::indexing::Slice(1, 3)}, 5);
  const auto weights = torch::randn({B});
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const auto base = (torch::randn({B, T, V}) * 3).to(dtype);
    // The reference: log_softmax of the float32 logits, shifted, gathered, masked, summed.
    const auto x = base.to(torch::kFloat).clone().requires_grad_(true);
    const auto lsm = torch::log_softmax(x.slice(1, 0, T - 1), -1);
    const auto sums = [&](const torch::Tensor& lab) {
      const auto tgt = lab.slice(1, 1);
      const auto kept = tgt.ne(-100);
      return (lsm.gather(2, tgt.clamp_min(0).unsqueeze(2)).squeeze(2) * kept).sum(1);
    };
    const auto want = sums(labels), want_full = sums(full);
    ((want * weights).sum() + (want_full * weights.flip(0)).sum()).backward();
    const auto kept = labels.slice(1, 1).ne(-100).to(torch::kFloat);
    const auto p = lsm.exp();
    const auto entropy = (-(p * lsm).sum(2) * kept).sum(1);
    const auto mean_logit = (x.slice(1, 0, T - 1).mean(2) * kept).sum(1);
    const auto top1 = (x.slice(1, 0, T - 1).argmax(2).eq(labels.slice(1, 1)) * kept).sum(1);
    for (int64_t block : {1, 5, 0}) {
      const auto logits = base.clone().requires_grad_(true);
      const auto s = sequence_logps(logits, labels, full, {true, block});
      const std::string at = std::string(c10::toString(dtype)) + " block " + std::to_string(block);
      expect_close(s.logps, want, at + " logps");
      expect_close(s.full_logps, want_full, at + " full_logps");
      expect_close(s.tokens, kept.sum(1), at + " tokens");
      expect_close(s.labelled, labels.ne(-100).sum(1).to(torch::kFloat), at + " labelled");
      expect_close(s.full_tokens, full.slice(1, 1).ne(-100).sum(1).to(torch::kFloat), at);
      expect_close(s.entropy_sum, entropy.detach(), at + " entropy");
      expect_close(s.mean_logit_sum, mean_logit.detach(), at + " mean logits");
      expect_close(s.top1, top1.to(torch::kFloat), at + " top-1");
      expect_close(s.logit_sum, x.slice(1, 0, T - 1).sum({1, 2}).detach(), at + " logit sum");
      expect_close(s.last_logit_sum, x.select(1, T - 1).sum(1).detach(), at + " last logits");
      ((s.logps * weights).sum() + (s.full_logps * weights.flip(0)).sum()).backward();
      ASSERT_EQ(logits.grad().scalar_type(), dtype);
      // The bfloat16 gradient is the float32 one rounded: 2^-8 relative.
      const double tol = dtype == torch::kFloat ? kRel : 4e-3;
      const auto err = (logits.grad().to(torch::kFloat) - x.grad()).abs().max().item<double>();
      EXPECT_LE(err, tol * x.grad().abs().max().item<double>()) << at << " gradient";
    }
    x.mutable_grad().reset();
  }
}

// sequence_logps_linear equals sequence_logps of the product, in chunks of every size, with an
// odd vocabulary (the aligned product's padded rows): sums, statistics and the gradients of
// hidden and weight.
TEST(Preference, LinearVariantMatchesTheLogits) {
  torch::manual_seed(11);
  const int64_t B = 4, T = 7, C = 16, V = 37;
  auto labels = torch::randint(0, V, {B, T}, torch::kLong);
  labels.index_put_({torch::indexing::Slice(), torch::indexing::Slice(0, 2)}, -100);
  const auto full = torch::randint(0, V, {B, T}, torch::kLong);
  const auto hidden = torch::randn({B, T, C}), weight = torch::randn({V, C}) * 0.5;
  const auto weights = torch::randn({B});
  const auto h0 = hidden.clone().requires_grad_(true), w0 = weight.clone().requires_grad_(true);
  const auto want = sequence_logps(torch::matmul(h0, w0.t()), labels, full);
  ((want.logps * weights).sum() - want.full_logps.sum()).backward();
  for (int64_t chunk : {1, 5, 0}) {
    const std::string at = "chunk " + std::to_string(chunk);
    const auto h = hidden.clone().requires_grad_(true), w = weight.clone().requires_grad_(true);
    const auto got = sequence_logps_linear(h, w, labels, full, {true, chunk});
    expect_close(got.logps, want.logps, at + " logps");
    expect_close(got.full_logps, want.full_logps, at + " full_logps");
    expect_close(got.entropy_sum, want.entropy_sum, at + " entropy");
    expect_close(got.mean_logit_sum, want.mean_logit_sum, at + " mean logits");
    expect_close(got.top1, want.top1, at + " top-1");
    expect_close(got.logit_sum, want.logit_sum, at + " logit sum");
    expect_close(got.last_logit_sum, want.last_logit_sum, at + " last logits");
    EXPECT_EQ(got.vocab, V);
    ((got.logps * weights).sum() - got.full_logps.sum()).backward();
    expect_close(h.grad(), h0.grad(), at + " d / d hidden");
    expect_close(w.grad(), w0.grad(), at + " d / d weight");
  }
}

// The linear variant never holds the whole [B, T, V] logits: its forward and backward peak below
// a quarter of them (a chunk's logits and temporaries, the weight's gradient), where
// sequence_logps over the product holds them and their gradient.
TEST(Preference, LinearVariantHoldsAChunkOfLogits) {
  torch::manual_seed(12);
  const int64_t B = 2, T = 512, C = 32, V = 16384;
  const auto labels = torch::randint(0, V, {B, T}, torch::kLong);
  const auto hidden = torch::randn({B, T, C}).requires_grad_(true);
  const auto weight = (torch::randn({V, C}) * 0.1).requires_grad_(true);
  const int64_t logits_bytes = B * T * V * 4;
  const auto fused = engine::measure_cpu_peak([&] {
    sequence_logps_linear(hidden, weight, labels, {}, {true, 32}).logps.sum().backward();
  });
  const auto plain = engine::measure_cpu_peak(
      [&] { sequence_logps(torch::matmul(hidden, weight.t()), labels).logps.sum().backward(); });
  EXPECT_LT(fused, logits_bytes / 4) << "plain: " << plain;
  EXPECT_GE(plain, logits_bytes);
}

// Under autocast the product runs in autocast's dtype, as the model's head runs it.
TEST(Preference, LinearVariantFollowsAutocast) {
  torch::manual_seed(13);
  const auto hidden = torch::randn({2, 5, 8}), weight = torch::randn({19, 8});
  const auto labels = torch::randint(0, 19, {2, 5}, torch::kLong);
  const auto h = hidden.clone().requires_grad_(true);
  torch::Tensor got;
  {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    got = sequence_logps_linear(h, weight, labels).logps;
    at::autocast::set_autocast_enabled(at::kCPU, false);
    at::autocast::clear_cache();
  }
  got.sum().backward();  // outside autocast, as training loops call it
  const auto hb = hidden.to(torch::kBFloat16).requires_grad_(true);
  const auto want =
      sequence_logps(torch::matmul(hb, weight.to(torch::kBFloat16).t()), labels).logps;
  want.sum().backward();
  expect_close(got, want, "bfloat16 product");
  expect_close(h.grad().to(torch::kBFloat16).to(torch::kFloat), hb.grad().to(torch::kFloat),
               "gradient");
  EXPECT_EQ(h.grad().scalar_type(), torch::kFloat);
  const auto in_float = sequence_logps_linear(hidden, weight, labels).logps;
  EXPECT_GT((in_float - got).abs().max().item<double>(), 1e-4);
}

// A reference pass (stats off, no gradient) gives the same sums and nothing else.
TEST(Preference, ReferencePassKeepsOnlyTheSums) {
  torch::manual_seed(3);
  const auto logits = torch::randn({2, 5, 11});
  const auto labels = torch::randint(0, 11, {2, 5}, torch::kLong);
  torch::NoGradGuard no_grad;
  const auto s = sequence_logps(logits, labels, {}, {false, 0});
  const auto with_stats = sequence_logps(logits, labels);
  EXPECT_TRUE(torch::equal(s.logps, with_stats.logps));
  EXPECT_FALSE(s.entropy_sum.defined());
  EXPECT_FALSE(s.full_logps.defined());
  EXPECT_FALSE(s.logps.requires_grad());
}

// Without statistics the log-probabilities still carry their gradient.
TEST(Preference, GradientWithoutStatistics) {
  torch::manual_seed(4);
  const auto logits = torch::randn({2, 5, 11}).requires_grad_(true);
  const auto labels = torch::randint(0, 11, {2, 5}, torch::kLong);
  const auto s = sequence_logps(logits, labels, {}, {false, 0});
  s.logps.sum().backward();
  const auto want = torch::autograd::grad({torch::log_softmax(logits, -1)
                                               .slice(1, 0, 4)
                                               .gather(2, labels.slice(1, 1).unsqueeze(2))
                                               .sum()},
                                          {logits})[0];
  expect_close(logits.grad(), want, "gradient");
}

// Forward, metrics and backward of every loss type read nothing back from the device: the caller
// reads the metrics once per log step.
TEST(Preference, NoHostReads) {
  torch::manual_seed(5);
  const auto labels =
      torch::randint(0, 13, {4, 6}, torch::kLong).index_fill_(1, torch::tensor(0), -100);
  for (auto type : {PreferenceLoss::sigmoid, PreferenceLoss::ipo, PreferenceLoss::hinge,
                    PreferenceLoss::robust, PreferenceLoss::simpo, PreferenceLoss::orpo}) {
    const auto logits = torch::randn({4, 6, 13}).requires_grad_(true);
    engine::OpCount count;
    PreferenceInputs in;
    in.policy = sequence_logps(logits, labels, labels);
    in.reference = in.policy.logps.detach() - 1;
    PreferenceOptions o;
    o.types = {type};
    o.cpo_alpha = 1.0;
    const auto result = preference_loss(in, o);
    result.loss.backward();
    EXPECT_EQ(count.host_syncs(), 0) << preference_loss_name(type);
    EXPECT_TRUE(logits.grad().defined()) << preference_loss_name(type);
  }
}

TEST(Preference, BadOptionsNameTheKeyAndTheFix) {
  const auto message = [](const PreferenceOptions& o) {
    try {
      check_preference_options(o);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  PreferenceOptions o;
  o.types = {PreferenceLoss::robust};
  o.label_smoothing = 0.5;
  EXPECT_NE(message(o).find("label_smoothing"), std::string::npos) << message(o);
  o = {};
  o.types = {PreferenceLoss::sigmoid, PreferenceLoss::orpo};
  EXPECT_NE(message(o).find("stands alone"), std::string::npos) << message(o);
  o = {};
  o.weights = {0.5, 0.5};
  EXPECT_NE(message(o).find("loss_weights"), std::string::npos) << message(o);
  o = {};
  o.beta = 0.0;
  EXPECT_NE(message(o).find("beta"), std::string::npos) << message(o);
  EXPECT_EQ(message(PreferenceOptions{}), "");
  EXPECT_THROW(parse_preference_loss("kto"), std::invalid_argument);
  // A DPO loss type without the reference's log-probabilities.
  PreferenceInputs in;
  in.policy = sequence_logps(torch::randn({2, 3, 4}), torch::ones({2, 3}, torch::kLong));
  EXPECT_THROW(preference_loss(in, PreferenceOptions{}), std::invalid_argument);
}

}  // namespace
}  // namespace trainer::losses
