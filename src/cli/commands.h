// The trainer's sub-commands besides training.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "config/loader.h"
#include "distributed/env.h"

namespace cxxopts {
class ParseResult;
}  // namespace cxxopts

namespace trainer::cli {

// A bad command line: printed with a pointer to --help, exit 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// trainer --config FILE [options]: trains. Returns the exit code.
int train_command(int argc, char** argv);

// trainer export --checkpoint PATH --out FILE; argv[0] is "export". Returns the exit code.
int export_command(int argc, char** argv);

// trainer doctor [--json] [--config FILE]; argv[0] is "doctor". Returns the exit code.
int doctor_command(int argc, char** argv);

// trainer doctor --perf [--config FILE [--set KEY=VALUE]...] [--quick] [--json]: measures the
// device, the collectives (under trainer launch) and the configured job against what they should
// reach; prints the table (rank 0). Every rank of a launched job must call it. Returns the exit
// code.
int doctor_perf(const std::string& config, const std::vector<std::string>& overrides, bool quick,
                bool json);

// trainer eval --checkpoint PATH|RUN_DIR [options]; argv[0] is "eval". Every rank of a launched
// job must call it. Returns the exit code.
int eval_command(int argc, char** argv);

// trainer bench --config FILE [options]; argv[0] is "bench". Returns the exit code.
int bench_command(int argc, char** argv);

// trainer bench --kernels [--device cuda[:N]] [--json FILE]: the fused CUDA kernels against
// ATen's operators (engine/use/kernel_bench.h). Returns the exit code.
int bench_kernels(const cxxopts::ParseResult& args);

// trainer predict --checkpoint PATH|RUN_DIR --input FILE|DIR [options]; argv[0] is "predict".
// Returns the exit code.
int predict_command(int argc, char** argv);

// trainer generate --checkpoint PATH|RUN_DIR [options]; argv[0] is "generate". Returns the exit
// code.
int generate_command(int argc, char** argv);

// trainer tokenize --tokenizer DIR --out FILE FILES...; argv[0] is "tokenize". Returns the exit
// code.
int tokenize_command(int argc, char** argv);

// The overrides of --set, then of --device as the `device=` it stands for (commands declaring
// both).
std::vector<std::string> set_and_device(const cxxopts::ParseResult& args);

// Sets up logging at --log-level `level_text` for this process of `job`: rank 0 at that level, the
// other ranks at warn or above. A level that is not one throws UsageError.
void setup_logging(const std::string& level_text, const distributed::DistEnv& job);

// Reads `path` with `overrides` over the built-in defaults (engine::config_defaults(): every
// model's, data set's and optimizer's own keys) and validates it against `env`. Throws
// config::ConfigError listing every problem.
config::LoadedConfig load_config(const std::string& path, const std::vector<std::string>& overrides,
                                 const config::Environment& env);

// The CUDA version LibTorch was built with, e.g. "13.0", or "cpu".
std::string cuda_build_version();

// What --version prints: the trainer's, LibTorch's and CUDA's versions, a line each.
std::string version_text();

// trainer launch [options] -- <trainer arguments>; argv[0] is "launch". Returns the exit code.
// Worker arguments of a training run are checked first (check_train_args): a bad command line or
// config is reported once, by the launcher, before any worker starts.
int launch_command(int argc, char** argv);

// Checks the arguments of a training run (`args`: after the program's name; "train" or an option
// first, else nothing is checked): its command line and its config, as train_command reads them.
// Throws UsageError or config::ConfigError. Reads no data and starts nothing.
void check_train_args(const std::vector<std::string>& args);

// Runs this trainer binary with `trainer_args` as a local job of `nproc` ranks, as
// `trainer launch --standalone --nproc-per-node <nproc> -- <trainer_args>` does; returns the
// launcher's exit code.
int run_local_job(const std::vector<std::string>& trainer_args, int nproc);

// The processes of launch.nproc_per_node: N, or for auto one per CUDA device (1 with none, or
// when `device` is cpu).
int local_processes(const std::string& nproc_per_node, const std::string& device);

}  // namespace trainer::cli
