// trainer: reads a YAML config and trains.
//
//   trainer --config FILE [--set KEY.PATH=VALUE]... [--run-dir DIR] [--device D] [--dry-run]
//           [--print-config] [--resume auto|PATH] [--log-level L]
//   trainer launch [--nproc-per-node N|auto] [--nnodes N] [--node-rank R] ... -- <trainer args>
//   trainer export --checkpoint PATH --out FILE.safetensors
//   trainer doctor [--json] [--config FILE]
//   trainer bench --config FILE [--steps N] [--warmup N] [--json FILE] ...
//   trainer --help | --version
//
// Exit codes: 0 success, 1 runtime failure, 2 usage or configuration error.
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/torch.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "config/loader.h"
#include "distributed/env.h"
#include "distributed/process_group.h"
#include "engine/components.h"
#include "engine/trainer.h"
#include "util/fileio.h"
#include "util/format.h"
#include "util/log.h"

namespace trainer::cli {

std::string cuda_build_version() {
  try {
    const long v = at::detail::getCUDAHooks().versionCUDART();  // e.g. 13000
    return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
  } catch (const std::exception&) {
    return "cpu";
  }
}

void setup_logging(const std::string& level_text, const distributed::DistEnv& job) {
  log::Level level;
  if (!log::parse_level(level_text, &level)) {
    throw UsageError("--log-level: unknown level '" + level_text +
                     "'; use trace, debug, info, warn or error");
  }
  if (job.rank > 0 && level < log::Level::warn) level = log::Level::warn;
  log::setup(level, job.rank);
}

config::LoadedConfig load_config(const std::string& path, const std::vector<std::string>& overrides,
                                 const config::Environment& env) {
  auto loaded = engine::load_config(path, overrides);
  config::check(loaded, env);
  return loaded;
}

}  // namespace trainer::cli

namespace {

namespace fs = std::filesystem;
using trainer::config::ConfigError;

constexpr int kOk = 0;
constexpr int kRuntimeError = 1;
constexpr int kUsageError = 2;

using trainer::cli::UsageError;

// Set by SIGINT/SIGTERM; the training loop stops after the current step and writes a checkpoint.
std::atomic<bool> g_stop_requested{false};

void on_stop_signal(int sig) {
  g_stop_requested.store(true);
  std::signal(sig, SIG_DFL);  // a second signal ends the process at once
}

std::string version_text() {
  return std::string("trainer ") + TRAINER_VERSION + "\nLibTorch " + TORCH_VERSION + "\nCUDA " +
         trainer::cli::cuda_build_version() + "\n";
}

cxxopts::Options train_options() {
  cxxopts::Options options("trainer", "Trains the model described by a YAML config.");
  options.custom_help("--config FILE [options]");
  // clang-format off
  options.add_options()
      ("c,config", "YAML config file", cxxopts::value<std::string>(), "FILE")
      ("set", "override a config key, e.g. --set optim.lr=0.01 (repeatable)",
       cxxopts::value<std::vector<std::string>>(), "KEY.PATH=VALUE")
      ("run-dir", "run directory (same as --set run.dir=DIR)", cxxopts::value<std::string>(), "DIR")
      ("device", "auto|cpu|cuda|cuda:N (same as --set device=D)", cxxopts::value<std::string>(),
       "D")
      ("dry-run", "validate, build the model and data, print the config and model summary, exit")
      ("print-config", "print the resolved config as YAML and exit")
      ("resume", "continue from the newest valid checkpoint of the run dir (auto; a fresh start "
       "when there is none) or from a checkpoint file", cxxopts::value<std::string>(), "auto|PATH")
      ("log-level", "trace|debug|info|warn|error", cxxopts::value<std::string>()->default_value("info"),
       "L")
      ("h,help", "print this help")
      ("version", "print the trainer, LibTorch and CUDA versions");
  // clang-format on
  return options;
}

int train(int argc, char** argv) {
  auto options = train_options();
  const cxxopts::ParseResult args = trainer::cli::parse_or_usage(options, argc, argv);
  if (args.count("help")) {
    std::cout << options.help()
              << "\nOther commands:\n"
                 "  trainer launch [--nproc-per-node N] [--nnodes N] [--node-rank R] ... -- ARGS"
                 "   data-parallel training on N processes per node (trainer launch --help)\n"
                 "  trainer export --checkpoint PATH --out FILE.safetensors"
                 "   model weights with PyTorch names\n"
                 "  trainer doctor [--json] [--config FILE]   check the GPU environment\n"
                 "  trainer bench --config FILE [--steps N] [--warmup N] [--json FILE]"
                 "   time training steps (trainer bench --help)\n"
              << "\nExit codes: 0 success (also: stopped by SIGINT/SIGTERM after a checkpoint), "
                 "1 runtime failure, 2 usage or configuration error.\n";
    return kOk;
  }
  if (args.count("version")) {
    std::cout << version_text();
    return kOk;
  }
  // A launched job's rank; rank 0 logs in full and writes the run dir, the others log warnings.
  const trainer::distributed::DistEnv job = trainer::distributed::read_process_env();
  trainer::cli::setup_logging(args["log-level"].as<std::string>(), job);
  if (!args.count("config")) throw UsageError("--config FILE is required");

  std::vector<std::string> overrides;
  if (args.count("set")) overrides = args["set"].as<std::vector<std::string>>();
  if (args.count("run-dir")) overrides.push_back("run.dir=" + args["run-dir"].as<std::string>());
  if (args.count("device")) overrides.push_back("device=" + args["device"].as<std::string>());

  if (args.count("resume")) {
    const auto resume = args["resume"].as<std::string>();
    if (resume != "auto" && !fs::is_regular_file(resume)) {
      throw UsageError("--resume: " + resume + " is not a checkpoint file (or use --resume auto)");
    }
  }
  const auto loaded = trainer::cli::load_config(args["config"].as<std::string>(), overrides,
                                                trainer::engine::config_environment());
  const std::string resolved = trainer::config::to_yaml(loaded.cfg);
  if (args.count("print-config")) {
    std::cout << resolved;
    return kOk;
  }

  trainer::engine::Trainer engine(loaded, job);
  if (args.count("dry-run")) {
    std::cout << resolved << "\n" << engine.summary();
    return kOk;
  }

  const fs::path run_dir = loaded.cfg.run.dir;
  if (job.rank == 0) {
    fs::create_directories(run_dir);
    trainer::write_text_atomically((run_dir / "config.yaml").string(), resolved);
    trainer::log::add_file((run_dir / "train.log").string(), /*rank=*/0);
  }
  trainer::log::info("trainer " TRAINER_VERSION ", LibTorch " TORCH_VERSION ", config " +
                     loaded.source + ", run dir " + run_dir.string());
  std::istringstream summary(engine.summary());
  for (std::string line; std::getline(summary, line);) trainer::log::info(line);

  if (args.count("resume")) {
    engine.resume(args["resume"].as<std::string>());
  } else if (job.restart_count > 0) {  // restarted by the launcher: go on from the newest one
    engine.resume("auto");
  }
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  const auto result = engine.fit(&g_stop_requested);
  if (result.stopped) {
    trainer::log::info("stopped after step " + std::to_string(result.steps) + "; checkpoint " +
                       engine.last_checkpoint());
    return kOk;
  }
  const auto& e = result.last_eval;
  if (e.samples > 0 && e.sequence) {
    trainer::log::info(trainer::strprintf("done: %lld steps in %.1f s; test loss %.4f, ppl %.3f",
                                          static_cast<long long>(result.steps), result.seconds,
                                          e.loss, e.ppl));
  } else if (e.samples > 0) {
    trainer::log::info(trainer::strprintf(
        "done: %lld steps in %.1f s; test loss %.4f, top-1 accuracy %.2f%%, top-5 %.2f%%",
        static_cast<long long>(result.steps), result.seconds, e.loss, 100.0 * e.top1,
        100.0 * e.top5));
  } else {
    trainer::log::info(trainer::strprintf("done: %lld steps in %.1f s",
                                          static_cast<long long>(result.steps), result.seconds));
  }
  return kOk;
}

// trainer export: the model weights of a checkpoint as a plain safetensors file with PyTorch
// state-dict names (torchvision's for the ResNets, nanoGPT's for gpt).
int export_weights(int argc, char** argv) {
  cxxopts::Options options("trainer export",
                           "Writes the model weights of a checkpoint as safetensors.");
  // clang-format off
  options.add_options()
      ("checkpoint", "a checkpoint file (<run.dir>/checkpoints/step_*.safetensors)",
       cxxopts::value<std::string>(), "PATH")
      ("out", "the safetensors file to write", cxxopts::value<std::string>(), "FILE")
      ("h,help", "print this help");
  // clang-format on
  const cxxopts::ParseResult args = trainer::cli::parse_or_usage(options, argc, argv);
  if (args.count("help")) {
    std::cout << options.help();
    return kOk;
  }
  if (!args.count("checkpoint") || !args.count("out")) {
    throw UsageError("export needs --checkpoint PATH and --out FILE");
  }
  trainer::log::setup(trainer::log::Level::info, /*rank=*/0);
  const auto path = args["checkpoint"].as<std::string>();
  const auto out = args["out"].as<std::string>();
  if (!fs::is_regular_file(path)) throw UsageError("--checkpoint: " + path + " is not a file");
  const auto state = trainer::checkpoint::load(path);
  const auto weights = trainer::engine::model_weights(state);
  const std::string model = state.meta.at("config").value("model.name", "?");
  trainer::write_atomically(out, [&](const trainer::ByteSink& sink) {
    trainer::checkpoint::write_safetensors(
        weights, {{"format", "pt"}, {"model", model}, {"step", state.meta.at("step").dump()}},
        sink);
  });
  std::cout << "wrote " << out << ": " << weights.size() << " tensors of " << model << " at step "
            << state.meta.at("step").dump() << "\n";
  return kOk;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc > 1 && std::string(argv[1]) == "export") return export_weights(argc - 1, argv + 1);
    if (argc > 1 && std::string(argv[1]) == "doctor") {
      return trainer::cli::doctor_command(argc - 1, argv + 1);
    }
    if (argc > 1 && std::string(argv[1]) == "launch") {
      return trainer::cli::launch_command(argc - 1, argv + 1);
    }
    if (argc > 1 && std::string(argv[1]) == "bench") {
      return trainer::cli::bench_command(argc - 1, argv + 1);
    }
    if (argc > 1 && argv[1][0] != '-') {
      throw UsageError(std::string("unknown command '") + argv[1] +
                       "'; commands: launch, bench, export, doctor");
    }
    return train(argc, argv);
  } catch (const UsageError& e) {
    std::cerr << "trainer: " << e.what() << " (see trainer --help)\n";
    return kUsageError;
  } catch (const ConfigError& e) {
    std::cerr << e.what() << "\n";
    return kUsageError;
  } catch (const trainer::distributed::EnvError& e) {
    std::cerr << "trainer: " << e.what() << "\n";
    return kUsageError;
  } catch (const trainer::UnknownName& e) {
    std::cerr << "trainer: " << e.what() << "\n";
    return kUsageError;
  } catch (const trainer::checkpoint::CorruptCheckpoint& e) {
    std::cerr << "trainer: " << e.what() << "\n";
    return kRuntimeError;
  } catch (const c10::Error& e) {
    std::cerr << "trainer: " << e.what_without_backtrace() << "\n";
    return kRuntimeError;
  } catch (const std::exception& e) {
    std::cerr << "trainer: " << e.what() << "\n";
    return kRuntimeError;
  }
}
