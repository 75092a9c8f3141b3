// trainer --config FILE: trains the run a config describes, writing its run dir.
#include <torch/version.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/options.h"
#include "config/loader.h"
#include "data/tokens/chat.h"
#include "distributed/env.h"
#include "engine/loop/trainer.h"
#include "engine/observe/mlflow_run.h"
#include "engine/observe/run_dir.h"
#include "engine/setup/components.h"
#include "util/fileio.h"
#include "util/format.h"
#include "util/log.h"

namespace trainer::cli {
namespace {

namespace fs = std::filesystem;

// Set by SIGINT/SIGTERM; the training loop stops after the current step and writes a checkpoint.
std::atomic<bool> g_stop_requested{false};

void on_stop_signal(int sig) {
  g_stop_requested.store(true);
  std::signal(sig, SIG_DFL);  // a second signal ends the process at once
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
      ("dry-run", "validate, plan the model (its shapes, no parameter allocated; model.pretrained's "
       "headers checked, no tensor read) and build the data, print the config and model summary, "
       "exit; --dry-run=load builds and loads the model as training does (each rank its part)",
       cxxopts::value<std::string>()->implicit_value("plan"), "plan|load")
      ("print-config", "print the resolved config as YAML and exit")
      ("nproc-per-node", "train as a local job of N processes, or one per GPU with auto (same as "
       "--set launch.nproc_per_node=N): DDP, or FSDP with dist.strategy fsdp, under the hood",
       cxxopts::value<std::string>(), "N|auto")
      ("resume", "continue from the newest valid checkpoint of the run dir (auto; a fresh start "
       "when there is none), of another run dir, or from a checkpoint file",
       cxxopts::value<std::string>(), "auto|RUN_DIR|PATH")
      ("log-level", "trace|debug|info|warn|error", cxxopts::value<std::string>()->default_value("info"),
       "L")
      ("h,help", "print this help")
      ("version", "print the trainer, LibTorch and CUDA versions");
  // clang-format on
  return options;
}

const char* kOtherCommands =
    "\nOther commands:\n"
    "  trainer launch [--nproc-per-node N] [--nnodes N] [--node-rank R] ... -- ARGS"
    "   data-parallel training on N processes per node (trainer launch --help)\n"
    "  trainer export --checkpoint PATH --out FILE.safetensors"
    "   model weights with PyTorch names\n"
    "  trainer doctor [--json] [--config FILE]   check the GPU environment\n"
    "  trainer doctor --perf [--quick] [--config FILE]"
    "   measure the server against its specification\n"
    "  trainer eval --checkpoint PATH|RUN_DIR [--json]"
    "   score a checkpoint on the validation split\n"
    "  trainer generate --checkpoint PATH|RUN_DIR [--prompt TEXT]"
    "   sample text from a language model\n"
    "  trainer predict --checkpoint PATH|RUN_DIR --input FILE|DIR"
    "   classify image files\n"
    "  trainer bench --config FILE [--steps N] [--warmup N] [--json FILE]"
    "   time training steps (trainer bench --help)\n"
    "  trainer tokenize --tokenizer DIR --out FILE.bin FILES..."
    "   text files to GPT-2 tokens for data.name: tokens\n"
    "\nExit codes: 0 success (also: stopped by SIGINT/SIGTERM after a checkpoint), "
    "1 runtime failure, 2 usage or configuration error.\n";

// --set, then --run-dir and --device as the overrides they stand for.
std::vector<std::string> overrides_of(const cxxopts::ParseResult& args) {
  std::vector<std::string> overrides;
  if (args.count("set")) overrides = args["set"].as<std::vector<std::string>>();
  if (args.count("run-dir")) overrides.push_back("run.dir=" + args["run-dir"].as<std::string>());
  if (args.count("device")) overrides.push_back("device=" + args["device"].as<std::string>());
  if (args.count("nproc-per-node")) {
    const std::string n = args["nproc-per-node"].as<std::string>();
    // The flag's own check, so that a mistake names the flag typed.
    const bool number = !n.empty() && n.size() <= 4 && n.find_first_not_of("0123456789") == n.npos;
    if (n != "auto" && (!number || std::stoi(n) < 1)) {
      throw UsageError("--nproc-per-node: must be a number of processes >= 1 or auto, got '" + n +
                       "'");
    }
    overrides.push_back("launch.nproc_per_node=" + n);
  }
  return overrides;
}

// Creates the run dir with its config.yaml and train.log (rank 0), and logs what runs.
void start_run_dir(const config::LoadedConfig& loaded, const distributed::DistEnv& job,
                   const std::string& resolved, const engine::Trainer& engine) {
  const fs::path run_dir = loaded.cfg.run.dir;
  if (job.rank == 0) {
    fs::create_directories(run_dir);
    write_text_atomically((run_dir / "config.yaml").string(), resolved);
    log::add_file((run_dir / "train.log").string(), /*rank=*/0);
  }
  log::info("trainer " TRAINER_VERSION ", LibTorch " TORCH_VERSION ", config " + loaded.source +
            ", run dir " + run_dir.string());
  std::istringstream summary(engine.summary());
  for (std::string line; std::getline(summary, line);) log::info(line);
}

// The run's last line: where it stopped, or its final evaluation.
void log_result(const engine::FitResult& result, const engine::Trainer& engine) {
  if (result.stopped) {
    log::info("stopped after step " + std::to_string(result.steps) + "; checkpoint " +
              engine.last_checkpoint());
    return;
  }
  const auto& e = result.last_eval;
  std::string line =
      result.first_step > 0
          ? strprintf("done: %" PRId64 " steps (%" PRId64 " in this process, %.1f s)", result.steps,
                      result.steps - result.first_step, result.seconds)
          : strprintf("done: %" PRId64 " steps in %.1f s", result.steps, result.seconds);
  if (e.samples > 0 && e.sequence) {
    line += strprintf("; val loss %.4f, ppl %.3f", e.loss, e.ppl);
  } else if (e.samples > 0) {
    line += strprintf("; val loss %.4f, top-1 accuracy %.2f%%, top-5 %.2f%%", e.loss,
                      100.0 * e.top1, 100.0 * e.top5);
  }
  log::info(line);
  log::info(strprintf("dispatch: %.0f ATen operators per step, %.2f host reads per step (%" PRId64
                      " more for logging, evaluation and checkpoints)",
                      result.ops_per_step, result.host_reads_per_step,
                      result.host_reads_outside_steps));
}

// The config.yaml of the run a resume continues: the run dir's (--resume auto, a restart), the one
// named, or the one holding the checkpoint file named (RUN_DIR/checkpoints/FILE).
fs::path resumed_config(const config::LoadedConfig& loaded, const std::string& resume) {
  std::error_code ec;
  if (resume.empty() || resume == "auto") return fs::path(loaded.cfg.run.dir) / "config.yaml";
  if (fs::is_directory(resume, ec)) return fs::path(resume) / "config.yaml";
  return fs::path(resume).parent_path().parent_path() / "config.yaml";
}

// data.chat_date of a run whose chat template dates its system header today (Llama 3.2),
// resolved once and recorded in config.yaml and the checkpoints: when resuming, the date the
// run's config.yaml recorded, else today's. Every rank takes rank 0's (the engine broadcasts it).
void resolve_chat_date(config::LoadedConfig& loaded, bool resuming, const std::string& resume) {
  if (!data::chat_dated_today(loaded.cfg.data, engine::data_context(loaded.cfg))) return;
  std::string date;
  const fs::path saved = resumed_config(loaded, resume);
  std::error_code ec;
  if (resuming && fs::is_regular_file(saved, ec)) {
    try {
      const auto before = config::load(saved.string(), {}, engine::config_defaults());
      if (before.cfg.data.name == "chat") date = before.cfg.data.own<data::ChatOptions>().chat_date;
    } catch (const std::exception& e) {
      log::warn("data.chat_date: " + saved.string() + " cannot be read (" + e.what() +
                "); the run renders today's date");
    }
  }
  if (date.empty()) date = data::chat_today();
  loaded.cfg.data.options.set("chat_date", date);
  log::info("data.chat_date: " + date + " (the date the " +
            std::string(resuming ? "resumed " : "") +
            "run renders in its chat template's system header, recorded in config.yaml)");
}

// --dry-run's kind: "plan" (the flag alone), "load", or "" without the flag.
std::string dry_run_kind(const cxxopts::ParseResult& args) {
  const std::string kind = args.count("dry-run") ? args["dry-run"].as<std::string>() : "";
  if (!kind.empty() && kind != "plan" && kind != "load") {
    throw UsageError("--dry-run: '" + kind +
                     "' is not a kind of dry run; use --dry-run (plan: no parameter allocated) "
                     "or --dry-run=load (the model built and loaded as training does)");
  }
  return kind;
}

}  // namespace

void check_train_args(const std::vector<std::string>& args) {
  if (args.empty() || (args[0] != "train" && args[0].rfind('-', 0) != 0)) return;  // not train
  std::vector<std::string> words = {"trainer"};
  words.insert(words.end(), args.begin() + (args[0] == "train" ? 1 : 0), args.end());
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  auto options = train_options();
  const cxxopts::ParseResult parsed =
      parse_or_usage(options, static_cast<int>(words.size()), argv.data());
  if (parsed.count("help") || parsed.count("version")) return;
  if (!parsed.count("config")) throw UsageError("--config FILE is required");
  load_config(parsed["config"].as<std::string>(), overrides_of(parsed),
              engine::config_environment());
}

int train_command(int argc, char** argv) {
  // First: a stop request, even during start-up, ends training after a step, with a checkpoint.
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  auto options = train_options();
  const cxxopts::ParseResult args = parse_or_usage(options, argc, argv);
  if (args.count("help")) {
    std::cout << options.help() << kOtherCommands;
    return 0;
  }
  if (args.count("version")) {
    std::cout << version_text();
    return 0;
  }
  // A launched job's rank; rank 0 logs in full and writes the run dir, the others log warnings.
  const distributed::DistEnv job = distributed::read_process_env();
  setup_logging(args["log-level"].as<std::string>(), job);
  if (!args.count("config")) throw UsageError("--config FILE is required");
  const std::string resume = args.count("resume") ? args["resume"].as<std::string>() : "";
  if (!resume.empty() && resume != "auto" && !fs::is_regular_file(resume) &&
      !fs::is_directory(resume)) {
    throw UsageError("--resume: " + resume +
                     " is neither a checkpoint file nor a run dir (or use --resume auto)");
  }
  auto loaded = load_config(args["config"].as<std::string>(), overrides_of(args),
                            engine::config_environment());
  resolve_chat_date(loaded, !resume.empty() || job.restart_count > 0, resume);
  const std::string resolved = config::to_yaml(loaded.cfg);
  if (args.count("print-config")) {
    std::cout << resolved;
    return 0;
  }
  engine::check_mlflow_setup(loaded);
  // launch.nproc_per_node above 1: this process becomes the launcher of a local job.
  const int nproc = local_processes(loaded.cfg.launch.nproc_per_node, loaded.cfg.device);
  if (!job.launched() && nproc > 1 && !args.count("dry-run")) {
    log::info("training as a local job of " + std::to_string(nproc) + " processes (dist.strategy " +
              loaded.cfg.dist.strategy + "), as trainer launch --standalone starts it");
    return run_local_job(std::vector<std::string>(argv + 1, argv + argc), nproc);
  }
  const std::string dry_run = dry_run_kind(args);
  engine::Trainer engine(loaded, job,
                         dry_run == "plan" ? engine::Build::plan : engine::Build::train);
  if (job.rank == 0) {
    for (const auto& w : engine.config_warnings()) log::warn(w);
  }
  if (!dry_run.empty()) {
    std::cout << resolved << "\n" << engine.summary();
    return 0;
  }
  // Restarted by the launcher: go on from the newest checkpoint.
  const bool resuming = !resume.empty() || job.restart_count > 0;
  std::optional<engine::RunDir> run_dir;
  if (job.rank == 0) run_dir.emplace(loaded, resuming);
  if (resuming) engine.resume(resume.empty() ? "auto" : resume);
  // Every check has passed: the run's files.
  start_run_dir(loaded, job, resolved, engine);
  log_result(engine.fit(&g_stop_requested), engine);
  return 0;
}

}  // namespace trainer::cli
