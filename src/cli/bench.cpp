// trainer bench: times training steps of a config and reports throughput, step-time
// percentiles, the time per phase, peak memory and the FLOP rate, as a table and as JSON.
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/options.h"
#include "config/loader.h"
#include "distributed/env.h"
#include "engine/loop/trainer.h"
#include "engine/setup/components.h"
#include "engine/use/bench.h"
#include "util/fileio.h"
#include "util/format.h"

namespace trainer::cli {
namespace {

std::string precision(const config::Config& cfg) {
  return cfg.amp.enabled ? cfg.amp.dtype : "float32";
}

// Each phase's milliseconds per step, by name.
nlohmann::json phases_json(const engine::BenchResult& r) {
  nlohmann::json phases = nlohmann::json::object();
  for (int p = 0; p < engine::kPhaseCount; ++p) {
    phases[engine::phase_name(static_cast<engine::Phase>(p))] = r.phase_ms[static_cast<size_t>(p)];
  }
  return phases;
}

// The process's resident memory now (VmRSS), in MiB; 0 where /proc does not say.
double resident_mb() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtod(line.c_str() + 6, nullptr) / 1024.0;
  }
  return 0.0;
}

nlohmann::json result_json(const engine::BenchResult& r, const engine::BenchOptions& o,
                           const engine::Trainer& t, const std::string& config_path) {
  const auto& cfg = t.config();
  const nlohmann::json phases = phases_json(r);
  return {{"impl", "trainer"},
          {"config", config_path},
          {"model", cfg.model.name},
          {"data", cfg.data.name},
          {"device", t.device().str()},
          {"device_name", r.device_name},
          {"precision", precision(cfg)},
          {"channels_last", config::lookup(cfg, "model.channels_last") == "true"},
          {"batch_size", cfg.data.batch_size},
          {"grad_accum_steps", cfg.train.grad_accum_steps},
          {"world_size", t.world_size()},
          {"tp_size", t.world_size() / std::max(1, t.data_parallel_size())},
          {"threads", torch::get_num_threads()},
          {"steps", o.steps},
          {"warmup", o.warmup},
          {"fixed_batch", o.fixed_batch},
          {"seconds", r.seconds},
          {"samples_per_sec", r.samples_per_sec},
          {"tokens_per_sec", r.tokens_per_sec > 0 ? nlohmann::json(r.tokens_per_sec) : nullptr},
          {"step_time_ms",
           {{"mean", r.step_ms.mean},
            {"p50", r.step_ms.p50},
            {"p90", r.step_ms.p90},
            {"max", r.step_ms.max}}},
          {"phases_ms", phases},
          {"peak_memory_mb", r.peak_memory_mb},
          {"peak_memory_kind", r.peak_memory_kind},
          {"flops_per_step", r.flops_per_step},
          {"tflops", r.tflops},
          {"peak_tflops", r.peak_tflops},
          {"mfu", r.mfu},
          {"final_loss", r.final_loss},
          {"optim_impl", config::lookup(cfg, "optim.impl").value_or("")},
          {"ops_per_step", r.ops_per_step},
          {"ops_by_name", r.ops_by_name},
          {"host_syncs_per_step", r.host_syncs_per_step},
          {"strategy", cfg.dist.strategy},
          {"held_bytes",
           {{"params", r.held.params},
            {"grads", r.held.grads},
            {"optimizer", r.held.optimizer},
            {"quantized", r.held.quantized},
            {"total", r.held.total()}}},
          {"comm_bytes_per_step", r.comm_bytes_per_step},
          {"activation_offload_bytes_per_step", r.activation_offload_bytes_per_step},
          {"comm_bytes_per_step_by_kind", r.comm_by_kind},
          {"profile", r.profile_trace.empty()
                          ? nlohmann::json(nullptr)
                          : nlohmann::json{{"trace", r.profile_trace},
                                           {"steps", o.profiled},
                                           {"ops_per_step", r.profiled_ops_per_step}}},
          {"versions",
           {{"trainer", TRAINER_VERSION},
            {"torch", TORCH_VERSION},
            {"cuda", cuda_build_version()},
            {"python", nullptr}}}};
}

std::string result_table(const engine::BenchResult& r, const engine::BenchOptions& o,
                         const engine::Trainer& t) {
  const auto& cfg = t.config();
  std::string out =
      strprintf("trainer bench: %s on %s, %s (%s), %s, batch %" PRId64 " x %" PRId64
                ", %d process%s, %d thread%s%s\n",
                cfg.model.name.c_str(), cfg.data.name.c_str(), t.device().str().c_str(),
                r.device_name.c_str(), precision(cfg).c_str(), cfg.data.batch_size,
                cfg.train.grad_accum_steps, t.world_size(), t.world_size() == 1 ? "" : "es",
                torch::get_num_threads(), torch::get_num_threads() == 1 ? "" : "s",
                o.fixed_batch ? ", one fixed batch" : "");
  out += strprintf("%" PRId64 " timed steps after %" PRId64 " warm-up steps, %.2f s\n\n", o.steps,
                   o.warmup, r.seconds);
  out += strprintf("  throughput    %.1f samples/s", r.samples_per_sec);
  if (r.tokens_per_sec > 0) out += strprintf(", %.0f tokens/s", r.tokens_per_sec);
  out += "\n";
  out += strprintf("  step time     p50 %.2f ms, p90 %.2f ms, max %.2f ms, mean %.2f ms\n",
                   r.step_ms.p50, r.step_ms.p90, r.step_ms.max, r.step_ms.mean);
  out += "  per step      ";
  for (int p = 0; p < engine::kPhaseCount; ++p) {
    const double ms = r.phase_ms[static_cast<size_t>(p)];
    out += strprintf("%s%s %.2f ms (%.0f%%)", p ? ", " : "",
                     engine::phase_name(static_cast<engine::Phase>(p)), ms,
                     r.step_ms.mean > 0 ? 100.0 * ms / r.step_ms.mean : 0.0);
  }
  out += "\n";
  out += strprintf(
      "  peak memory   %.0f MiB (%s)\n", r.peak_memory_mb,
      r.peak_memory_kind == "cuda_allocator" ? "CUDA caching allocator" : "process peak RSS");
  out += strprintf(
      "  compute       %.3g GFLOP per step, %.3g TFLOP/s, %.1f%% of the measured %.3g TFLOP/s "
      "matrix-product peak\n",
      static_cast<double>(r.flops_per_step) / 1e9, r.tflops, 100.0 * r.mfu, r.peak_tflops);
  out += strprintf("  final loss    %.4f\n", r.final_loss);
  out += strprintf(
      "  held state    %.1f MiB per rank (%s): parameters %.1f, gradients %.1f, optimizer %.1f%s\n",
      r.held.total() / 1048576.0,
      (cfg.dist.strategy +
       (t.world_size() > t.data_parallel_size()
            ? strprintf(", tensor parallel over %d", t.world_size() / t.data_parallel_size())
            : std::string()))
          .c_str(),
      r.held.params / 1048576.0, r.held.grads / 1048576.0, r.held.optimizer / 1048576.0,
      r.held.quantized ? strprintf(", quantized base %.1f", r.held.quantized / 1048576.0).c_str()
                       : "");
  out += strprintf("  communicated  %.3f MiB per step:", r.comm_bytes_per_step / 1048576.0);
  for (const auto& [kind, bytes] : r.comm_by_kind) {
    out += strprintf(" %s %.3f,", kind.c_str(), bytes / 1048576.0);
  }
  out.back() = '\n';
  if (!r.ops_per_step.empty()) {
    const auto& ops = r.ops_per_step;
    out += strprintf(
        "  dispatch      %.0f ATen operators per step (forward %.0f, backward %.0f, optimizer "
        "%.0f, other %.0f), %.1f host reads per step\n",
        ops.at("total"), ops.at("forward"), ops.at("backward"), ops.at("optimizer"),
        ops.at("other"), r.host_syncs_per_step);
  }
  return out;
}

cxxopts::Options bench_options() {
  cxxopts::Options options("trainer bench",
                           "Times training steps of a config: throughput, step time, the time of "
                           "each phase, peak memory, FLOP rate.");
  // clang-format off
  options.add_options()
      ("c,config", "YAML config file", cxxopts::value<std::string>(), "FILE")
      ("set", "override a config key (repeatable)", cxxopts::value<std::vector<std::string>>(),
       "KEY.PATH=VALUE")
      ("device", "auto|cpu|cuda|cuda:N (same as --set device=D)", cxxopts::value<std::string>(),
       "D")
      ("steps", "timed steps", cxxopts::value<int64_t>()->default_value("50"), "N")
      ("warmup", "untimed steps before them", cxxopts::value<int64_t>()->default_value("10"), "N")
      ("count-steps", "untimed steps after them whose ATen operators and host reads are counted "
       "(0: none)", cxxopts::value<int64_t>()->default_value("3"), "N")
      ("fixed-batch", "train every step on the first batch, kept on the device: the step's "
       "speed without the data loader")
      ("json", "also write the figures as one JSON object to FILE", cxxopts::value<std::string>(),
       "FILE")
      ("profile", "after the timed steps, record 3 more with the Kineto profiler into "
       "DIR/rank_<N>.trace.json (Chrome trace) and print the operators by self time",
       cxxopts::value<std::string>(), "DIR")
      ("profile-shapes", "with --profile: record the operators' input shapes")
      ("to-target", "instead of timed steps, train as `trainer train` does (into run.dir) until "
       "the first evaluation that reaches train.stop_at's (or train.stop_at_top1's) target, and "
       "report the time to it from the first step and from start-up (MLPerf's run time)")
      ("kernels", "instead of training steps, time the fused CUDA kernels (normalisation, "
       "activation, rotary) against ATen's operators: GB/s against the device's copy rate "
       "(a GPU; --device picks it, --json writes the rows)")
      ("log-level", "trace|debug|info|warn|error",
       cxxopts::value<std::string>()->default_value("warn"), "L")
      ("h,help", "print this help");
  // clang-format on
  return options;
}

// The timing options of the command line.
engine::BenchOptions timing_options(const cxxopts::ParseResult& args) {
  engine::BenchOptions opts;
  opts.steps = args["steps"].as<int64_t>();
  opts.warmup = args["warmup"].as<int64_t>();
  opts.counted = args["count-steps"].as<int64_t>();
  opts.fixed_batch = args.count("fixed-batch") > 0;
  if (opts.steps < 1)
    throw UsageError("--steps must be at least 1, got " + std::to_string(opts.steps));
  if (opts.counted < 0) {
    throw UsageError("--count-steps must not be negative, got " + std::to_string(opts.counted));
  }
  if (opts.warmup < 0) {
    throw UsageError("--warmup must not be negative, got " + std::to_string(opts.warmup));
  }
  if (args.count("profile")) {
    opts.profile_dir = args["profile"].as<std::string>();
    opts.profile_shapes = args.count("profile-shapes") > 0;
    std::error_code ec;
    std::filesystem::create_directories(opts.profile_dir, ec);
    if (!std::filesystem::is_directory(opts.profile_dir)) {
      throw UsageError("--profile: cannot create the directory " + opts.profile_dir +
                       (ec ? ": " + ec.message() : ""));
    }
  }
  return opts;
}

// bench --to-target: a training run to the config's target, its time to the target reported.
// Exit 0 when the target was reached, 1 when the run ended without reaching it.
int bench_to_target(const config::LoadedConfig& loaded, const distributed::DistEnv& job,
                    const std::string& config_path, const cxxopts::ParseResult& args) {
  const auto& train = loaded.cfg.train;
  if (!train.stop_at.enabled() && !(train.stop_at_top1 > 0.0)) {
    throw UsageError(
        "--to-target: the config sets no target; set train.stop_at (e.g. --set "
        "train.stop_at.metric=val/loss --set train.stop_at.below=0.925) or train.stop_at_top1");
  }
  engine::Trainer trainer(loaded, job);
  if (job.rank == 0) std::filesystem::create_directories(loaded.cfg.run.dir);
  const engine::FitResult r = trainer.fit();
  if (job.rank != 0) return r.reached_target ? 0 : 1;
  const auto seconds = [&](double s) { return r.reached_target ? nlohmann::json(s) : nullptr; };
  const nlohmann::json result = {
      {"impl", "trainer"},
      {"config", config_path},
      {"run_dir", loaded.cfg.run.dir},
      {"reached_target", r.reached_target},
      {"steps", r.steps},
      {"seconds_to_target", seconds(r.target_seconds)},
      {"seconds_to_target_from_start", seconds(r.target_seconds_from_start)},
      {"val_loss", r.last_eval.loss}};
  if (r.reached_target) {
    std::cout << strprintf("trainer bench --to-target: the target reached after step %" PRId64
                           ": %.3f s from the first step, %.3f s from start-up\n",
                           r.steps, r.target_seconds, r.target_seconds_from_start);
  } else {
    std::cout << strprintf("trainer bench --to-target: the target not reached in %" PRId64
                           " steps (the last val/loss %.4f)\n",
                           r.steps, r.last_eval.loss);
  }
  std::cout << std::flush;
  if (args.count("json")) {
    write_text_atomically(args["json"].as<std::string>(), result.dump(2) + "\n");
  }
  return r.reached_target ? 0 : 1;
}

}  // namespace

int bench_command(int argc, char** argv) {
  auto options = bench_options();
  const cxxopts::ParseResult args = parse_or_usage(options, argc, argv);
  if (args.count("help")) {
    std::cout << options.help()
              << "\nRuns in a launched job too (trainer launch ... -- bench --config FILE): rank 0 "
                 "reports, throughput counts every rank's samples. No run dir is written.\n";
    return 0;
  }
  if (args.count("kernels")) return bench_kernels(args);
  if (!args.count("config")) throw UsageError("bench: --config FILE is required");
  const engine::BenchOptions opts = timing_options(args);
  const distributed::DistEnv job = distributed::read_process_env();
  setup_logging(args["log-level"].as<std::string>(), job);

  const std::string config_path = args["config"].as<std::string>();
  if (args.count("json")) {  // refused before the measurement, not after it
    const std::string why =
        output_problem(args["json"].as<std::string>(), OutputKind::file, {config_path});
    if (!why.empty()) throw UsageError("--json " + why);
  }
  const auto loaded = load_config(config_path, set_and_device(args), engine::config_environment());
  if (args.count("to-target")) return bench_to_target(loaded, job, config_path, args);

  const double resident_before = resident_mb();  // the process before it builds the run
  engine::Trainer trainer(loaded, job);
  const auto result = engine::run_bench(trainer, opts);
  if (job.rank != 0) return 0;
  std::cout << result_table(result, opts, trainer) << std::flush;
  if (!result.profile_trace.empty()) {
    std::cout << "\nprofile: " << result.profile_trace << "\n"
              << result.profile_table << std::flush;
  }
  if (args.count("json")) {
    auto json = result_json(result, opts, trainer, config_path);
    json["resident_before_build_mb"] = resident_before;
    write_text_atomically(args["json"].as<std::string>(), json.dump(2) + "\n");
  }
  return 0;
}

}  // namespace trainer::cli
