// trainer launch: starts this node's workers of a distributed run, like torchrun
// (launch/launcher.h).
#include <torch/cuda.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "launch/launcher.h"

namespace trainer::cli {
namespace {

// The CUDA devices LibTorch sees; 0 without CUDA.
int cuda_devices() {
  return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
}

// The path of the running trainer binary: every worker runs the same one.
std::string own_executable() {
  char path[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) throw std::runtime_error("cannot resolve /proc/self/exe");
  return std::string(path, static_cast<size_t>(n));
}

}  // namespace

int run_local_job(const std::vector<std::string>& trainer_args, int nproc) {
  std::vector<std::string> args = {"--standalone", "--nproc-per-node", std::to_string(nproc), "--"};
  args.insert(args.end(), trainer_args.begin(), trainer_args.end());
  launch::LaunchCommand command = launch::parse_launch_args(args, cuda_devices);
  command.options.program = own_executable();
  return launch::run(command.options, std::cout, std::cerr, std::cerr);
}

int local_processes(const std::string& nproc_per_node, const std::string& device) {
  // As trainer launch reads --nproc-per-node; a run on the CPU has no GPU to count.
  return launch::parse_nproc(nproc_per_node,
                             device == "cpu" ? std::function<int()>() : std::function<int()>(cuda_devices));
}

int launch_command(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  launch::LaunchCommand command;
  try {
    command = launch::parse_launch_args(args, cuda_devices);
  } catch (const launch::ArgumentError& e) {
    throw UsageError(e.what());
  }
  if (command.help) {
    std::cout << launch::launch_help();
    return 0;
  }
  command.options.program = own_executable();
  // Once here rather than once per worker (and again in the failure report).
  check_train_args(command.options.args);
  return launch::run(command.options, std::cout, std::cerr, std::cerr);
}

}  // namespace trainer::cli
