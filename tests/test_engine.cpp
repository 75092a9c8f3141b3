// The training engine: accumulation, clipping, evaluation, config errors found while building.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <fstream>
#include <map>

#include "checkpoint/checkpoint.h"
#include "config/loader.h"
#include "engine/loop/graphed_step.h"
#include "engine/loop/spike_guard.h"
#include "engine/loop/trainer.h"
#include "engine/measure/memory.h"
#include "engine/measure/op_count.h"
#include "engine/setup/components.h"
#include "engine_fixture.h"
#include "models/model.h"
#include "temp_dir.h"

namespace trainer::engine {
namespace {

TEST_F(EngineTest, AccumulatingTwoHalfBatchesEqualsOneFullBatch) {
  auto full_cfg = load({"data.batch_size=32", "train.grad_accum_steps=1"});
  auto half_cfg = load({"data.batch_size=16", "train.grad_accum_steps=2"});
  Trainer full(full_cfg), half(half_cfg);
  const auto a = full.fit(), b = half.fit();
  EXPECT_EQ(a.steps, 4);
  EXPECT_EQ(b.steps, 4);
  EXPECT_NEAR(a.last_eval.loss, b.last_eval.loss, 1e-5);
}

TEST_F(EngineTest, StopsAtTheFirstEvaluationThatReachesTheTargetTopOne) {
  // Learnable synthetic classes: top-1 climbs over the first epochs.
  auto loaded = load({"train.max_steps=0", "train.epochs=30", "train.stop_at_top1=0.9",
                      "optim.lr=0.5", "data.noise=0.3"});
  Trainer trainer(loaded);
  const auto r = trainer.fit();
  EXPECT_TRUE(r.reached_target);
  EXPECT_FALSE(r.stopped);
  EXPECT_GE(r.last_eval.top1, 0.9);
  EXPECT_LT(r.steps, 30 * 4);  // 4 steps per epoch
  EXPECT_EQ(r.steps % 4, 0);   // at an epoch's evaluation
  EXPECT_FALSE(trainer.last_checkpoint().empty());
}

TEST_F(EngineTest, ClippingBoundsTheUpdate) {
  auto free_cfg = load({});
  auto clipped_cfg = load({"train.clip_grad_norm=1e-6"});
  Trainer free(free_cfg), clipped(clipped_cfg), untrained(load({}));
  const double start = untrained.evaluate().loss;
  const double free_loss = free.fit().last_eval.loss;
  const double clipped_loss = clipped.fit().last_eval.loss;
  EXPECT_LT(free_loss, start - 0.05);
  // 4 steps of at most lr * 1e-6 in norm barely move the weights.
  EXPECT_NEAR(clipped_loss, start, 1e-4);
}

TEST_F(EngineTest, EvaluationCountsEverySample) {
  auto cfg = load({"data.eval_batch_size=50"});  // 64 = 50 + 14
  Trainer t(cfg);
  const auto e = t.evaluate();
  EXPECT_EQ(e.samples, 64);
  EXPECT_GE(e.top5, e.top1);
  EXPECT_DOUBLE_EQ(e.top5, 1.0);  // 3 classes: the target is always among the top 5
}

// run.eval_batches: an evaluation in training reads that many batches (the first 50 of the 64
// samples, whose loss is the full evaluation's over those samples); trainer eval reads them all.
TEST_F(EngineTest, EvalBatchesLimitsTheEvaluationsOfTraining) {
  auto limited_cfg = load({"data.eval_batch_size=50", "run.eval_batches=1"});
  auto first_cfg = load({"data.eval_batch_size=50", "data.val_samples=50"});
  Trainer limited(limited_cfg), first(first_cfg);
  const auto during = limited.fit().last_eval;
  EXPECT_EQ(during.samples, 50);
  first.fit();
  EXPECT_NEAR(during.loss, first.evaluate().loss, 1e-6);  // the same weights, the same 50 samples
  EXPECT_EQ(limited.evaluate().samples, 64);
}

TEST_F(EngineTest, MaxStepsAcrossEpochs) {
  auto cfg = load({"train.max_steps=10"});  // 4 steps per epoch
  Trainer t(cfg);
  EXPECT_EQ(t.fit().steps, 10);
}

TEST_F(EngineTest, StopFlagEndsAfterTheCurrentStep) {
  auto cfg = load({"train.max_steps=100"});
  Trainer t(cfg);
  std::atomic<bool> stop{true};
  const auto r = t.fit(&stop);
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.steps, 1);
}

TEST_F(EngineTest, BatchLargerThanTheDataIsAConfigError) {
  auto cfg = load({"data.batch_size=100", "train.grad_accum_steps=2"});
  try {
    Trainer t(cfg);
    FAIL() << "expected ConfigError";
  } catch (const config::ConfigError& e) {
    ASSERT_EQ(e.issues().size(), 1u);
    EXPECT_EQ(e.issues()[0].key, "data.batch_size");
    EXPECT_NE(e.issues()[0].where.file.find("--set data.batch_size=100"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("128 training samples"), std::string::npos) << e.what();
  }
}

TEST_F(EngineTest, LenetOnFlatSamplesIsAConfigError) {
  auto cfg = load({"model.name=lenet"});
  try {
    Trainer t(cfg);
    FAIL() << "expected ConfigError";
  } catch (const config::ConfigError& e) {
    EXPECT_EQ(e.issues().at(0).key, "data.shape");
  }
}

// The host reads of a training step, as docs/architecture.md lists them: the step's flags (skip,
// stop, found_inf) once when anything needs deciding; clipping reads nothing.
TEST_F(EngineTest, HostSyncsPerStep) {
  auto syncs_per_step = [&](const std::vector<std::string>& overrides) {
    Trainer trainer(load(overrides));
    StepObserver quiet;
    trainer.run_steps(/*steps=*/1, quiet);
    OpCount count;
    trainer.run_steps(/*steps=*/4, quiet);
    return static_cast<double>(count.host_syncs()) / 4.0;
  };
  // The flags (bad loss, found_inf) are decided on the device and read a step late from pinned
  // memory: no host read in a step, with every fused optimizer, a scaler and clipping.
  EXPECT_EQ(syncs_per_step({}), 0.0);
  EXPECT_EQ(syncs_per_step({"train.max_bad_steps=0"}), 0.0);
  EXPECT_EQ(syncs_per_step({"amp.enabled=true", "amp.scaler=on"}), 0.0);
  EXPECT_EQ(syncs_per_step({"train.clip_grad_norm=1"}), 0.0);
  EXPECT_EQ(syncs_per_step({"optim.name=adamw", "train.clip_grad_norm=1"}), 0.0);
  EXPECT_EQ(syncs_per_step({"optim.name=sgd", "optim.momentum=0.9", "amp.scaler=on"}), 0.0);
  // The spike guard decides on the device too; the weight average is device work.
  EXPECT_EQ(
      syncs_per_step({"train.skip_update_zscore.loss=3", "train.skip_update_zscore.grad_norm=3",
                      "train.skip_update_zscore.window=2", "train.ema.decay=0.9"}),
      0.0);
  // An optimizer that cannot skip on the device: the decision is read at once.
  EXPECT_EQ(syncs_per_step({"optim.impl=loop"}), 1.0);
  EXPECT_EQ(syncs_per_step({"optim.impl=foreach"}), 1.0);
}

// A real run (fit) counts the same: no host read inside a step, the reads of logging, evaluation
// and checkpoints outside; an optimizer that cannot skip on the device reads once a step.
TEST_F(EngineTest, FitReportsHostReadsAndOperatorsPerStep) {
  for (const auto& [impl, want] : {std::pair<std::string, double>{"fused", 0.0}, {"loop", 1.0}}) {
    SCOPED_TRACE(impl);
    Trainer trainer(load({"train.max_steps=8", "run.log_every=4", "optim.impl=" + impl}));
    const auto r = trainer.fit();
    EXPECT_EQ(r.host_reads_per_step, want);
    EXPECT_GT(r.host_reads_outside_steps, 0);  // two log lines, an evaluation, a checkpoint
    // The operators of steps 2 to 4, as bench counts them.
    EXPECT_GT(r.ops_per_step, 10.0);
  }
}

TEST(MemoryTest, CountsWhatTheCpuAllocatorHandsOut) {
  const int64_t peak = measure_cpu_peak([] {
    auto a = torch::empty({1 << 18});  // 1 MiB
    auto b = torch::empty({1 << 17});  // 0.5 MiB, both alive at once
  });
  EXPECT_GE(peak, (1 << 20) + (1 << 19));
  EXPECT_LT(peak, 2 << 20);
  EXPECT_EQ(measure_cpu_peak([] {}), 0);
}

// A planned run (Build::plan: the model on the meta device, its step counted on meta tensors)
// holds no parameter storage, and estimates what the built run measures on the CPU: the same
// parameter and optimizer bytes, the step's bytes per sample and fixed bytes close, in float32
// and under bfloat16 autocast (emulated on meta tensors), for a llama with LoRA and a resnet.
TEST_F(EngineTest, APlannedRunEstimatesTheMemoryABuiltRunMeasures) {
  const std::vector<std::vector<std::string>> runs = {
      {"model.name=llama", "model.n_layer=2", "model.n_head=4", "model.n_embd=64",
       "model.intermediate_size=160", "model.block_size=64", "model.vocab_size=0",
       "data.name=synthetic_tokens", "data.num_classes=512", "data.seq_len=64", "optim.name=adamw"},
      {"model.name=llama", "model.n_layer=2", "model.n_head=4", "model.n_embd=64",
       "model.intermediate_size=160", "model.block_size=64", "model.vocab_size=0",
       "data.name=synthetic_tokens", "data.num_classes=512", "data.seq_len=64", "optim.name=adamw",
       "model.lora.rank=4", "model.lora.targets=[q_proj,v_proj]"},
      {"model.name=resnet18", "model.num_classes=0", "data.shape=[3,32,32]", "data.num_classes=10",
       "optim.momentum=0.9"}};
  for (const auto& sets : runs) {
    const auto cfg = load(sets);
    Trainer built(cfg);
    Trainer planned(cfg, {}, Build::plan);
    for (const auto& p : planned.model().parameters()) ASSERT_TRUE(p.is_meta()) << sets[0];
    for (const bool bf16 : {false, true}) {
      const auto want = built.estimate_memory(bf16);
      const auto got = planned.estimate_memory(bf16);
      const std::string what =
          sets[0] + (sets.size() > 11 ? " lora" : "") + (bf16 ? " bfloat16" : " float32");
      EXPECT_EQ(got.params_bytes, want.params_bytes) << what;
      EXPECT_EQ(got.optimizer_bytes, want.optimizer_bytes) << what;
      const auto near = [&](double a, double b, double rel) {
        EXPECT_NEAR(a, b, rel * std::max(std::abs(b), 1.0))
            << what << ": planned " << a << ", measured " << b;
      };
      near(static_cast<double>(got.step_bytes_per_sample),
           static_cast<double>(want.step_bytes_per_sample), bf16 ? 0.25 : 0.15);
      near(static_cast<double>(got.total(8)), static_cast<double>(want.total(8)),
           bf16 ? 0.25 : 0.15);
    }
  }
}

TEST_F(EngineTest, MemoryEstimateMatchesAMeasuredStep) {
  // ResNet-18 at 48 px: the estimate from batches 2 and 4, checked against batch 8 measured.
  auto cfg = load({"model.name=resnet18", "model.num_classes=0", "data.shape=[3,48,48]",
                   "data.num_classes=10", "optim.momentum=0.9"});
  Trainer t(cfg);
  const auto fp32 = t.estimate_memory(/*bf16=*/false);
  const auto bf16 = t.estimate_memory(/*bf16=*/true);
  EXPECT_GT(fp32.params_bytes, 40'000'000);            // 11.2M float parameters
  EXPECT_EQ(fp32.optimizer_bytes, fp32.params_bytes);  // one momentum buffer each
  EXPECT_GT(fp32.step_bytes_per_sample, 0);
  EXPECT_LT(bf16.step_bytes_per_sample, fp32.step_bytes_per_sample);
  // The same model with every block checkpointed keeps less per sample.
  const auto checkpointed = t.estimate_memory(/*bf16=*/false, /*checkpointing=*/"blocks");
  EXPECT_EQ(checkpointed.params_bytes, fp32.params_bytes);
  EXPECT_LT(checkpointed.step_bytes_per_sample, fp32.step_bytes_per_sample);

  auto model = models::build_model(cfg.cfg.model, models::InputSpec{{3, 48, 48}, 10});
  model->train();
  const auto x = torch::randn({8, 3, 48, 48});
  const auto y = torch::randint(10, {8}, torch::kInt64);
  const int64_t measured = measure_cpu_peak([&] {
    auto loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    loss.backward();
  });
  const int64_t estimated = fp32.step_fixed_bytes + 8 * fp32.step_bytes_per_sample;
  EXPECT_NEAR(static_cast<double>(estimated), static_cast<double>(measured), 0.25 * measured)
      << "estimated " << estimated << ", measured " << measured;
}

TEST_F(EngineTest, InfInOneGradientSkipsExactlyThatStep) {
  // Adam keeps per-parameter step counts and moments: a skipped step must leave them as they were.
  const std::vector<std::string> common = {"amp.scaler=on", "optim.name=adam", "optim.lr=0.01",
                                           "sched.name=linear", "sched.min_lr=0.001"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), common.begin(), common.end());
    return load(extra);
  };
  // Both runs span 3 steps (the same schedule); the clean one stops after step 2.
  const auto injected_cfg = with({"train.max_steps=3"});
  Trainer injected(injected_cfg);
  int calls = 0;
  auto weight = injected.model().parameters().at(0);
  weight.register_hook([&calls](torch::Tensor grad) {
    return ++calls == 3 ? torch::full_like(grad, INFINITY) : grad;
  });
  Trainer clean(with({"train.max_steps=3", "train.stop_at_step=2"}));
  EXPECT_EQ(injected.fit().steps, 3);
  clean.fit();
  EXPECT_EQ(calls, 3);
  const auto a = checkpoint_tensors(injected), b = checkpoint_tensors(clean);
  expect_same(a, b, "model.");
  expect_same(a, b, "optim.");
  EXPECT_EQ(a.at("scaler.scale").item<double>(), 32768.0);  // backed off once
  EXPECT_EQ(b.at("scaler.scale").item<double>(), 65536.0);
  EXPECT_EQ(a.at("scaler.growth_tracker").item<int>(), 0);
  EXPECT_EQ(b.at("scaler.growth_tracker").item<int>(), 2);
  const auto meta = checkpoint::load(injected.last_checkpoint()).meta;
  EXPECT_EQ(meta.at("skipped_steps").get<int64_t>(), 1);
  // The train record of step 3 reports the scale and the skip.
  std::ifstream metrics(injected_cfg.cfg.run.dir + "/metrics.jsonl");
  std::vector<nlohmann::json> train;
  for (std::string line; std::getline(metrics, line);) {
    if (line.find("\"train\"") != std::string::npos) train.push_back(nlohmann::json::parse(line));
  }
  ASSERT_EQ(train.size(), 3u);
  const auto& record = train.back();
  EXPECT_EQ(record.at("step").get<int64_t>(), 3);
  EXPECT_EQ(record.at("loss_scale").get<double>(), 32768.0);
  EXPECT_EQ(record.at("skipped_steps").get<int64_t>(), 1);
  // The schedule did not advance: step 3 reports the learning rate of the last update, step 2's.
  EXPECT_EQ(record.at("lr").get<double>(), train[1].at("lr").get<double>());
  EXPECT_NE(train[0].at("lr").get<double>(), train[1].at("lr").get<double>());
}

// A fused step divides the gradients by the scale itself (torch.amp's fused=True path): weights,
// optimizer state, skipped steps and scale updates come out bit for bit as when the scaler
// unscales them first (forced here by a clipping norm too large to clip anything).
TEST_F(EngineTest, FusedStepsTakeTheScaleAsUnscalingFirstWould) {
  auto run = [&](const std::vector<std::string>& extra) {
    auto o = extra;
    for (const char* key : {"amp.scaler=on", "optim.name=adam", "optim.impl=fused", "optim.lr=0.01",
                            "train.max_steps=4"}) {
      o.push_back(key);
    }
    Trainer trainer(load(o));
    int calls = 0;
    auto weight = trainer.model().parameters().at(0);
    weight.register_hook([&calls](torch::Tensor grad) {
      return ++calls == 2 ? torch::full_like(grad, INFINITY) : grad;
    });
    trainer.fit();
    return checkpoint_tensors(trainer);
  };
  const auto kernel = run({}), separate = run({"train.clip_grad_norm=1e30"});
  expect_same(kernel, separate, "model.");
  expect_same(kernel, separate, "optim.");
  expect_same(kernel, separate, "scaler.");
  EXPECT_EQ(kernel.at("scaler.scale").item<double>(), 32768.0);  // backed off once
}

// Runs step `step` (0-based) over the next batch of `loader` in both steppers, and returns each
// one's outcome.
std::pair<StepOutcome, StepOutcome> run_both(data::Loader& loader, int step, Stepper& a,
                                             Stepper& b) {
  if (step % loader.batches_per_epoch() == 0) loader.start_epoch(step / loader.batches_per_epoch());
  const std::vector<data::Batch> batch{*loader.next()};
  a.run(batch, false, nullptr);
  b.run(batch, false, nullptr);
  const auto x = a.settle(), y = b.settle();
  EXPECT_EQ(x.size(), 1u);
  EXPECT_EQ(y.size(), 1u);
  return {x.at(0), y.at(0)};
}

// A step replayed from a graph (train.cuda_graph; here the plumbing without a device graph)
// trains as the eager step: the same skipped steps and scale, the same losses and weights within
// float32 rounding of the learning rate, with the skip decided on the device, with and without
// clipping.
TEST_F(EngineTest, GraphedStepsTrainAsEagerOnes) {
  for (const bool clip : {false, true}) {
    SCOPED_TRACE(clip ? "clipping" : "no clipping");
    const auto cfg =
        load({"amp.scaler=on", "optim.name=adamw", "optim.impl=fused", "optim.lr=0.01",
              "optim.weight_decay=0.1", "sched.name=linear", "sched.min_lr=0.001",
              "train.max_steps=8", clip ? "train.clip_grad_norm=0.5" : "train.clip_grad_norm=0"});
    auto eager_parts = build_components(cfg, {});
    auto graph_parts = build_components(cfg, {});
    TrainingState eager_state, graph_state;
    TrainStep eager(eager_parts, cfg.cfg.train, eager_state);
    GraphedStep graphed(graph_parts, cfg.cfg.train, graph_state, eager_graph(), /*warmup=*/2);
    // Step 5 (a replayed one) meets an inf gradient in both.
    for (auto* parts : {&eager_parts, &graph_parts}) {
      auto calls = std::make_shared<int>(0);
      parts->params.at(0).register_hook([calls](torch::Tensor grad) {
        return ++*calls == 5 ? torch::full_like(grad, INFINITY) : grad;
      });
    }
    for (int step = 0; step < 8; ++step) {
      const auto [a, b] = run_both(*eager_parts.train_loader, step, eager, graphed);
      EXPECT_EQ(a.step, step + 1);
      EXPECT_EQ(b.step, step + 1);
      EXPECT_EQ(a.skipped, b.skipped) << "step " << step + 1;
      // Within the rounding of the learning rate, which the graph reads as a float32 tensor.
      EXPECT_NEAR(eager.last_loss().item<float>(), graphed.last_loss().item<float>(), 1e-6)
          << "step " << step + 1;
    }
    EXPECT_EQ(graph_state.skipped_steps, 1);
    EXPECT_EQ(eager_state.skipped_steps, graph_state.skipped_steps);
    EXPECT_EQ(eager_parts.scaler->scale_value(), graph_parts.scaler->scale_value());
    for (size_t i = 0; i < eager_parts.params.size(); ++i) {
      EXPECT_TRUE(torch::allclose(eager_parts.params[i], graph_parts.params[i], /*rtol=*/1e-6,
                                  /*atol=*/1e-7))
          << "parameter " << i << " differs by "
          << (eager_parts.params[i] - graph_parts.params[i]).abs().max().item<float>();
    }
  }
}

// The training path (fit: the loader's batches, logging, evaluation, checkpoints, the flags read a
// step late) and the bench path (run_steps) run the same graphed step: after the same steps over
// the same batches, the same weights and optimizer state, bit for bit.
TEST_F(EngineTest, TrainingAndBenchRunTheSameGraphedStep) {
  const std::vector<std::string> sets = {
      "optim.name=adamw",  "optim.lr=0.01",   "train.clip_grad_norm=1", "amp.scaler=on",
      "train.max_steps=9", "run.log_every=2", "run.eval_every=4",       "run.checkpoint_every=3"};
  auto fit_cfg = load(sets);
  auto bench_cfg = load(sets);
  // A graphed step on the CPU replays its work eagerly (the config check allows it on CUDA only).
  fit_cfg.cfg.train.cuda_graph = bench_cfg.cfg.train.cuda_graph = true;
  Trainer trained(fit_cfg), benched(bench_cfg);
  EXPECT_EQ(trained.fit().steps, 9);
  StepObserver quiet;
  benched.run_steps(/*steps=*/9, quiet, /*fixed_batch=*/false);
  const auto a = models::state_dict(trained.model()), b = models::state_dict(benched.model());
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;
  }
}

TEST_F(EngineTest, ScalerStateResumesExactly) {
  // Growth every 2 clean steps: the resumed run must carry on the count of the first.
  const std::vector<std::string> scaler = {"amp.scaler=on", "amp.growth_interval=2",
                                           "amp.init_scale=4", "train.max_steps=6",
                                           "optim.momentum=0.9"};
  auto whole_cfg = load(scaler);
  Trainer whole(whole_cfg);
  whole.fit();
  auto split = scaler;
  split.push_back("train.stop_at_step=3");
  auto split_cfg = load(split);
  {
    Trainer first(split_cfg);
    EXPECT_TRUE(first.fit().stopped);
  }
  Trainer second(split_cfg);
  ASSERT_TRUE(second.resume("auto"));
  second.fit();
  const auto a = checkpoint_tensors(whole), b = checkpoint_tensors(second);
  EXPECT_EQ(a.at("scaler.scale").item<double>(), 32.0);  // 4 * 2^3
  expect_same(a, b, "scaler.");
  expect_same(a, b, "model.");
  expect_same(a, b, "optim.");
}

TEST_F(EngineTest, BadLossesStopTheRunWithTheLastGoodState) {
  // A learning rate of 1e30 leaves finite weights after step 1 whose logits overflow from step 2.
  const std::vector<std::string> diverge = {"optim.lr=1e30", "train.max_bad_steps=3",
                                            "train.max_steps=50"};
  auto cfg = load(diverge);
  Trainer t(cfg);
  try {
    t.fit();
    FAIL() << "expected the run to stop";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("inf/NaN in 3 steps in a row, steps 2 to 4"), std::string::npos) << what;
    EXPECT_NE(what.find("as after step 1"), std::string::npos) << what;
    EXPECT_NE(what.find(t.last_checkpoint()), std::string::npos) << what;
  }
  // Stopped at the step whose loss made it the third bad one in a row, as when the flags were
  // read within each step: its checkpoint is step 4's, with 3 skipped steps.
  const auto meta = checkpoint::load(t.last_checkpoint()).meta;
  EXPECT_EQ(meta.at("step").get<int64_t>(), 4);
  EXPECT_EQ(meta.at("skipped_steps").get<int64_t>(), 3);
  EXPECT_EQ(meta.at("step_in_epoch").get<int64_t>(), 4);
  auto one = diverge;
  one.push_back("train.max_steps=1");
  auto one_cfg = load(one);
  Trainer after_one(one_cfg);
  after_one.fit();
  const auto stopped = checkpoint_tensors(t), good = checkpoint_tensors(after_one);
  expect_same(stopped, good, "model.");
  for (const auto& [name, tensor] : stopped) {
    if (name.rfind("model.", 0) == 0) EXPECT_TRUE(tensor.isfinite().all().item<bool>()) << name;
  }
}

TEST_F(EngineTest, Bf16AutocastTrainsOnTheCpu) {
  auto fp32_cfg = load({"train.max_steps=8"});
  auto bf16_cfg = load({"train.max_steps=8", "amp.enabled=true", "amp.dtype=bfloat16"});
  Trainer fp32(fp32_cfg), bf16(bf16_cfg);
  EXPECT_NE(bf16.summary().find("precision: bfloat16 autocast\n"), std::string::npos);
  const double start = fp32.evaluate().loss;
  const double a = fp32.fit().last_eval.loss, b = bf16.fit().last_eval.loss;
  EXPECT_LT(b, start - 0.05);
  EXPECT_NEAR(a, b, 0.05);
  EXPECT_NE(a, b);  // bfloat16 arithmetic did happen
}

// The spike guard in a replayed step (train.cuda_graph; here without a device graph) skips what
// it skips in the eager step: a gradient 1000 times too large at step 7 is a spike of the
// gradient norm in both, its update skipped, the weights the same.
TEST_F(EngineTest, GraphedAndEagerStepsSkipTheSameSpike) {
  const auto cfg =
      load({"optim.impl=fused", "train.max_steps=10", "train.skip_update_zscore.grad_norm=3",
            "train.skip_update_zscore.window=4"});
  auto eager_parts = build_components(cfg, {});
  auto graph_parts = build_components(cfg, {});
  TrainingState eager_state, graph_state;
  SpikeGuard eager_guard(cfg.cfg.train.skip_update_zscore, torch::kCPU);
  SpikeGuard graph_guard(cfg.cfg.train.skip_update_zscore, torch::kCPU);
  TrainStep eager(eager_parts, cfg.cfg.train, eager_state, &eager_guard);
  GraphedStep graphed(graph_parts, cfg.cfg.train, graph_state, eager_graph(), /*warmup=*/2,
                      &graph_guard);
  for (auto* parts : {&eager_parts, &graph_parts}) {
    auto calls = std::make_shared<int>(0);
    parts->params.at(0).register_hook(
        [calls](torch::Tensor grad) { return ++*calls == 7 ? grad * 1000.0 : grad; });
  }
  for (int step = 0; step < 10; ++step) {
    const auto [a, b] = run_both(*eager_parts.train_loader, step, eager, graphed);
    EXPECT_EQ(a.spike, step + 1 == 7) << "step " << step + 1;
    EXPECT_EQ(b.spike, a.spike) << "step " << step + 1;
    EXPECT_EQ(a.skipped, a.spike);
    if (a.spike) EXPECT_GT(a.z_grad_norm, 3.0f);
    EXPECT_NEAR(a.z_grad_norm, b.z_grad_norm, 1e-3) << "step " << step + 1;
  }
  EXPECT_EQ(eager_state.spike_skips, 1);
  EXPECT_EQ(graph_state.spike_skips, 1);
  EXPECT_EQ(eager_state.skipped_steps, 1);
  for (size_t i = 0; i < eager_parts.params.size(); ++i) {
    EXPECT_TRUE(torch::allclose(eager_parts.params[i], graph_parts.params[i], /*rtol=*/1e-6,
                                /*atol=*/1e-7))
        << "parameter " << i;
  }
}

// train.rollback_on_nan: a NaN gradient at step 6 makes the weights NaN and step 7's loss NaN
// (read at the end of step 7, which logs); the run goes back to step 4's checkpoint and on with
// the data after step 7, the schedule's clock back at step 4's.
TEST_F(EngineTest, RollbackGoesBackToTheCheckpointAndOnAfterTheBadData) {
  const std::vector<std::string> common = {"train.max_steps=12", "run.checkpoint_every=4",
                                           "run.keep_last=10", "sched.name=linear",
                                           "sched.min_lr=0.01"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), common.begin(), common.end());
    return load(extra);
  };
  const auto nan_at_call_6 = [](Trainer& t) {
    auto calls = std::make_shared<int>(0);
    t.model().parameters().at(0).register_hook(
        [calls](torch::Tensor grad) { return ++*calls == 6 ? torch::full_like(grad, NAN) : grad; });
  };
  Trainer clean(with({}));
  clean.fit();
  const auto clean_dir = clean.config().run.dir;
  // Stopped right after the rollback: the weights are step 4's.
  auto stop_cfg = with({"train.rollback_on_nan=true", "train.stop_at_step=7"});
  Trainer stopped(stop_cfg);
  nan_at_call_6(stopped);
  EXPECT_TRUE(stopped.fit().stopped);
  const auto at_7 = checkpoint_tensors(stopped);
  const auto step_4 = checkpoint::load(clean_dir + "/checkpoints/step_00000004.safetensors");
  expect_same(at_7, {step_4.tensors.begin(), step_4.tensors.end()}, "model.");
  // The same with run.checkpoint_async: the rollback waits for the write in flight first.
  Trainer async(
      with({"train.rollback_on_nan=true", "train.stop_at_step=7", "run.checkpoint_async=true"}));
  nan_at_call_6(async);
  EXPECT_TRUE(async.fit().stopped);
  expect_same(checkpoint_tensors(async), {step_4.tensors.begin(), step_4.tensors.end()}, "model.");
  // The whole run: 12 steps, 3 of them undone, its position the clean run's.
  auto run_cfg = with({"train.rollback_on_nan=true"});
  Trainer rolled(run_cfg);
  nan_at_call_6(rolled);
  EXPECT_EQ(rolled.fit().steps, 12);
  const auto meta = checkpoint::load(rolled.last_checkpoint()).meta;
  const auto clean_meta = checkpoint::load(clean.last_checkpoint()).meta;
  EXPECT_EQ(meta.at("rollbacks").get<int64_t>(), 1);
  EXPECT_EQ(meta.at("rolled_back_steps").get<int64_t>(), 3);
  EXPECT_EQ(meta.at("skipped_steps").get<int64_t>(), 3);
  EXPECT_EQ(meta.at("epoch"), clean_meta.at("epoch"));
  EXPECT_EQ(meta.at("step_in_epoch"), clean_meta.at("step_in_epoch"));
  for (const auto& [name, tensor] : checkpoint_tensors(rolled)) {
    if (name.rfind("model.", 0) == 0) EXPECT_TRUE(tensor.isfinite().all().item<bool>()) << name;
  }
  // Step 8's learning rate is the clean run's step 5's: the clock went back with the weights.
  const auto lr_at = [](const std::string& dir, int64_t step) {
    std::ifstream in(dir + "/metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const auto r = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (r.is_discarded()) continue;  // a NaN loss, written as Python's json writes it
      if (r.at("split") == "train" && r.at("step") == step) return r.at("lr").get<double>();
    }
    return -1.0;
  };
  EXPECT_EQ(lr_at(run_cfg.cfg.run.dir, 8), lr_at(clean_dir, 5));
  EXPECT_NE(lr_at(clean_dir, 8), lr_at(clean_dir, 5));
}

// Settings a run cannot honour are config errors, each naming its key.
TEST_F(EngineTest, GuardAndSnapshotSettingsTheRunCannotHonourAreConfigErrors) {
  const auto issues_of = [&](const std::vector<std::string>& sets, bool cuda) {
    const auto path = tmp_ / "bad.yaml";
    std::ofstream(path) << "model: {name: mlp}\ndata: {name: synthetic}\n";
    auto loaded = engine::load_config(path.string(), sets);
    config::Environment env;
    env.cuda_available = cuda;
    std::vector<std::string> keys;
    try {
      config::check(loaded, env);
    } catch (const config::ConfigError& e) {
      for (const auto& issue : e.issues()) keys.push_back(issue.key);
    }
    return keys;
  };
  using Keys = std::vector<std::string>;
  EXPECT_EQ(issues_of({"profile.memory_snapshot=true"}, false), Keys{"profile.memory_snapshot"});
  EXPECT_EQ(issues_of({"profile.memory_snapshot=true", "device=cpu"}, true),
            Keys{"profile.memory_snapshot"});
  EXPECT_EQ(issues_of({"profile.memory_snapshot=true"}, true), Keys{});
  EXPECT_EQ(issues_of({"profile.memory_snapshot_step=3"}, true),
            Keys{"profile.memory_snapshot_step"});
  EXPECT_EQ(issues_of({"train.rollback_on_nan=true", "train.max_bad_steps=0"}, false),
            Keys{"train.rollback_on_nan"});
  EXPECT_EQ(issues_of({"train.rollback_on_nan=true", "train.cuda_graph=true", "device=cuda",
                       "optim.impl=fused", "data.drop_last=true"},
                      true),
            Keys{"train.cuda_graph"});
  EXPECT_EQ(issues_of({"train.ema.decay=1"}, false), Keys{"train.ema.decay"});
  EXPECT_EQ(issues_of({"train.ema.every=0"}, false), Keys{"train.ema.every"});
  EXPECT_EQ(issues_of({"train.skip_update_zscore.window=1"}, false),
            Keys{"train.skip_update_zscore.window"});
  EXPECT_EQ(issues_of({"tracking.mlflow.uri=localhost:5000"}, false), Keys{"tracking.mlflow.uri"});
  EXPECT_EQ(issues_of({"tracking.mlflow.tags=team"}, false), Keys{"tracking.mlflow.tags"});
  EXPECT_EQ(issues_of({"tracking.mlflow.uri=http://127.0.0.1:5000",
                       "tracking.mlflow.tags=team=a, owner = b"},
                      false),
            Keys{});
}

}  // namespace
}  // namespace trainer::engine
