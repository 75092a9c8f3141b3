// trainer: reads a YAML config and trains.
//
//   trainer --config FILE [--set KEY.PATH=VALUE]... [--run-dir DIR] [--device D] [--dry-run]
//           [--print-config] [--resume auto|PATH] [--log-level L]
//   trainer launch [--nproc-per-node N|auto] [--nnodes N] [--node-rank R] ... -- <trainer args>
//   trainer export --checkpoint PATH --out FILE.safetensors
//   trainer doctor [--json] [--config FILE]
//   trainer bench --config FILE [--steps N] [--warmup N] [--json FILE] ...
//   trainer eval --checkpoint PATH|RUN_DIR [--config FILE] [--set K=V]... [--json]
//   trainer generate --checkpoint PATH|RUN_DIR [--prompt TEXT] [--max-new-tokens N] ...
//   trainer predict --checkpoint PATH|RUN_DIR --input FILE|DIR [--top-k K] [--json]
//   trainer tokenize --tokenizer DIR --out FILE [--threads N] FILES...
//   trainer --help | --version
//
// Exit codes: 0 success, 1 runtime failure, 2 usage or configuration error.
#include <c10/util/Exception.h>

#include <malloc.h>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <string>

#include "checkpoint/checkpoint.h"
#include "cli/commands.h"
#include "config/issues.h"
#include "config/registry.h"
#include "distributed/env.h"
#include "util/log.h"

namespace {

constexpr int kRuntimeError = 1;
constexpr int kUsageError = 2;

// The sub-commands, by the name that follows `trainer`.
struct Command {
  const char* name;
  int (*run)(int argc, char** argv);
};
constexpr Command kCommands[] = {
    {"train", trainer::cli::train_command},       {"launch", trainer::cli::launch_command},
    {"bench", trainer::cli::bench_command},       {"eval", trainer::cli::eval_command},
    {"generate", trainer::cli::generate_command}, {"export", trainer::cli::export_command},
    {"doctor", trainer::cli::doctor_command},     {"predict", trainer::cli::predict_command},
    {"tokenize", trainer::cli::tokenize_command}};

int dispatch(int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return trainer::cli::train_command(argc, argv);
  std::string known;
  for (const auto& c : kCommands) {
    if (argv[1] == std::string(c.name)) return c.run(argc - 1, argv + 1);
    known += (known.empty() ? "" : ", ") + std::string(c.name);
  }
  throw trainer::cli::UsageError(std::string("unknown command '") + argv[1] +
                                 "'; commands: " + known);
}

}  // namespace

int main(int argc, char** argv) {
  // A write past `ulimit -f` fails with EFBIG, a save failure with its message, instead of the
  // signal ending the process.
  std::signal(SIGXFSZ, SIG_IGN);
#ifdef __GLIBC__
  // Tensors of 1 MiB and more are mapped on their own and go back to the system when freed.
  // glibc otherwise raises its mapping threshold to the largest block freed (up to 32 MiB), after
  // which freed tensors stay in the heap and a CPU run's resident memory grows well past what it
  // holds (docs/benchmarks.md, "The memory plan against measured peaks"). MALLOC_MMAP_THRESHOLD_
  // in the environment wins.
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") == nullptr) mallopt(M_MMAP_THRESHOLD, 1 << 20);
#endif
  try {
    // Every command logs on stderr from its start (spdlog's default logger writes to stdout,
    // which carries data: doctor --json, export, generate's text); a command's --log-level
    // installs the logger again.
    trainer::log::setup(trainer::log::Level::info, 0);
    return dispatch(argc, argv);
  } catch (const trainer::cli::UsageError& e) {
    std::cerr << "trainer: " << e.what() << " (see trainer --help)\n";
    return kUsageError;
  } catch (const trainer::config::ConfigError& e) {
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
