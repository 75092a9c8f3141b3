// trainer launch's entry points (launcher.h): the command line, its help text, and run(), which
// checks the options, prepares the workers' environment and hands over to the supervisor.
#include "launch/launcher.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <ostream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "launch/supervisor.h"
#include "launch/worker.h"
#include "util/cxxopts.h"
#include "util/net/net.h"

namespace trainer::launch {
namespace {

void check(const LaunchOptions& o) {
  auto fail = [](const std::string& what) { throw std::invalid_argument("launch: " + what); };
  if (o.program.empty()) fail("no program to run");
  if (o.nproc_per_node < 1) fail("nproc_per_node must be at least 1");
  if (o.nnodes < 1) fail("nnodes must be at least 1");
  if (o.node_rank < 0 || o.node_rank >= o.nnodes) fail("node_rank must be in [0, nnodes)");
  if (o.master_port < 1 || o.master_port > 65535) fail("master_port must be in 1..65535");
  if (o.max_restarts < 0) fail("max_restarts must not be negative");
  if (!(o.grace_s >= 0) || !std::isfinite(o.grace_s)) fail("grace_s must be a finite number >= 0");
}

// --- the command line --------------------------------------------------------------------------

cxxopts::Options command_options() {
  cxxopts::Options options("trainer launch",
                           "Starts this node's workers of a distributed run, like torchrun.");
  options.custom_help("[options] -- <trainer arguments>");
  // clang-format off
  options.add_options()
      ("nproc-per-node", "workers on this node: a number, auto (one per GPU; one without a GPU), "
       "gpu (one per GPU, which must exist) or cpu (one per CPU) (default 1)",
       cxxopts::value<std::string>(), "N")
      ("nnodes", "nodes in the run (default 1)", cxxopts::value<std::string>(), "N")
      ("node-rank", "this node's index, 0..nnodes-1 (default 0)", cxxopts::value<std::string>(),
       "R")
      ("master-addr", "host of rank 0 (default 127.0.0.1)", cxxopts::value<std::string>(), "HOST")
      ("master-port", "rendezvous port on that host (default 29500)",
       cxxopts::value<std::string>(), "PORT")
      ("max-restarts", "times the workers are started again after a failure (default 0)",
       cxxopts::value<std::string>(), "K")
      ("standalone", "one node on 127.0.0.1 with a free port")
      ("log-dir", "also write each rank's output to DIR/rank_<N>.log",
       cxxopts::value<std::string>(), "DIR")
      ("grace-period", "seconds from SIGTERM to SIGKILL when stopping workers (default 10)",
       cxxopts::value<std::string>(), "S")
      ("local-ranks-filter", "show only these local ranks' output on the console, e.g. 0 or 0,2 "
       "(log files keep every rank's)", cxxopts::value<std::string>(), "R[,R...]")
      ("no-prefix", "console lines without the \"[rank<N>]: \" prefix: with --local-ranks-filter 0, "
       "rank 0's output as the command printed it (its --json)")
      ("h,help", "print this help");
  // clang-format on
  return options;
}

// "--nproc_per_node=2" -> "--nproc-per-node=2": underscores in a long option's name only.
std::string normalise(const std::string& arg) {
  if (arg.size() <= 2 || arg.compare(0, 2, "--") != 0) return arg;
  std::string out = arg;
  const size_t end = std::min(out.find('='), out.size());
  std::replace(out.begin() + 2, out.begin() + static_cast<std::ptrdiff_t>(end), '_', '-');
  return out;
}

int parse_int(const std::string& flag, const std::string& text, long min, long max) {
  errno = 0;
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || value < min || value > max) {
    throw ArgumentError("--" + flag + ": expected an integer in " + std::to_string(min) + ".." +
                        std::to_string(max) + ", got '" + text + "'");
  }
  return static_cast<int>(value);
}

int cpu_count() {
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

// "0,2" -> {0, 2}: local ranks, each at least 0, listed once.
std::vector<int> parse_ranks(const std::string& text) {
  std::vector<int> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    const int rank = parse_int("local-ranks-filter", item, 0, 1 << 16);
    if (std::find(out.begin(), out.end(), rank) != out.end()) {
      throw ArgumentError("--local-ranks-filter: rank " + item + " is listed twice");
    }
    out.push_back(rank);
  }
  if (out.empty()) throw ArgumentError("--local-ranks-filter: expected ranks such as 0 or 0,2");
  return out;
}

std::string random_run_id() {
  std::random_device random;
  char text[33];
  std::snprintf(text, sizeof text, "%08x%08x%08x%08x", random(), random(), random(), random());
  return text;
}

}  // namespace

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  if (abbrev == nullptr) return "signal " + std::to_string(sig);
  return std::string("SIG") + abbrev;
}

std::string launch_help() {
  return command_options().help() +
         "\nEach worker runs the trainer with the arguments after --, in the launcher's "
         "environment "
         "plus\nRANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, "
         "ROLE_RANK,\nROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT, "
         "TORCHELASTIC_MAX_RESTARTS\nand TORCHELASTIC_RUN_ID (and OMP_NUM_THREADS=1 when it is "
         "unset and there are several\nworkers). Their output is prefixed with [rank<N>]:. When "
         "a worker fails the others get SIGTERM,\nthen SIGKILL after the grace period; the group "
         "is restarted while restarts remain, except\nafter exit code 2. SIGINT/SIGTERM are "
         "passed to the workers; a second one kills them.\n"
         "\nA flag left out takes a scheduler's value: PET_NPROC_PER_NODE, PET_NNODES, "
         "PET_NODE_RANK,\nPET_MASTER_ADDR, PET_MASTER_PORT, PET_MAX_RESTARTS (torchrun's, as "
         "Kubeflow's TrainJob\nsets them), else a Volcano or PyTorchJob pod's WORLD_SIZE, RANK, "
         "MASTER_ADDR and\nMASTER_PORT (without LOCAL_RANK); not with --standalone.\n"
         "\nExit codes: 0 all workers exited 0, 1 a worker failed, 2 usage or configuration "
         "error.\n";
}

namespace {

// The launcher's own options (before "--", underscores normalised), parsed.
cxxopts::ParseResult parse_own(std::vector<std::string> own) {
  own.insert(own.begin(), "launch");
  auto options = command_options();
  std::vector<char*> argv;
  for (auto& arg : own) argv.push_back(arg.data());
  argv.push_back(nullptr);
  cxxopts::ParseResult parsed;
  try {
    parsed = options.parse(static_cast<int>(own.size()), argv.data());
  } catch (const cxxopts::exceptions::exception& e) {
    throw ArgumentError(e.what());
  }
  if (!parsed.unmatched().empty()) {
    throw ArgumentError("unexpected argument '" + parsed.unmatched().front() + "'");
  }
  return parsed;
}

// --standalone: one node on 127.0.0.1, a free port and a random run id.
void make_standalone(const cxxopts::ParseResult& parsed, LaunchOptions& o) {
  if (o.nnodes != 1) throw ArgumentError("--standalone runs one node; drop --nnodes");
  if (parsed.count("master-addr") || parsed.count("master-port")) {
    throw ArgumentError("--standalone picks its own address and port; drop --master-addr/-port");
  }
  o.master_addr = "127.0.0.1";
  o.master_port = free_port();
  o.run_id = random_run_id();
}

// A flag's value from what a scheduler sets for the launcher, when the command line lacks it:
// torchrun's PET_<FLAG> (Kubeflow Trainer's TrainJob sets PET_NNODES, PET_NPROC_PER_NODE,
// PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT in each node's pod), else, for the nodes'
// layout, what Volcano's PyTorch plugin and Kubeflow's PyTorchJob give each pod (WORLD_SIZE its
// pods, RANK this pod's index, MASTER_ADDR, MASTER_PORT), recognised when all of WORLD_SIZE, RANK
// and MASTER_ADDR are set and no LOCAL_RANK (a worker's). `source` receives the variable's name.
std::optional<std::string> from_scheduler(const std::string& flag, std::string& source) {
  std::string pet = "PET_";
  for (const char c : flag) pet += c == '-' ? '_' : static_cast<char>(std::toupper(c));
  if (const char* v = std::getenv(pet.c_str())) {
    source = pet;
    return std::string(v);
  }
  static const std::vector<std::pair<std::string, const char*>> pod = {
      {"nnodes", "WORLD_SIZE"},
      {"node-rank", "RANK"},
      {"master-addr", "MASTER_ADDR"},
      {"master-port", "MASTER_PORT"}};
  const bool pods = std::getenv("WORLD_SIZE") && std::getenv("RANK") &&
                    std::getenv("MASTER_ADDR") && !std::getenv("LOCAL_RANK");
  for (const auto& [name, variable] : pod) {
    const char* v = std::getenv(variable);
    if (pods && name == flag && v) {
      source = std::string(variable) + " (a Volcano or PyTorchJob pod's)";
      return std::string(v);
    }
  }
  return std::nullopt;
}

// The options' values, checked one by one: the command line's, else (without --standalone) the
// scheduler's (from_scheduler; each recorded in o.from_environment).
void read_options(const cxxopts::ParseResult& parsed, const std::function<int()>& gpu_count,
                  LaunchOptions& o) {
  const bool standalone = parsed.count("standalone") > 0;
  std::string source;  // of the value text() returned last: the flag, or a variable
  auto text = [&](const char* flag) -> std::optional<std::string> {
    source = std::string("--") + flag;
    if (parsed.count(flag)) return parsed[flag].as<std::string>();
    if (standalone) return std::nullopt;
    auto v = from_scheduler(flag, source);
    if (v) o.from_environment.push_back(std::string("--") + flag + " " + *v + " from " + source);
    return v;
  };
  // A value's parse; an error names the variable that gave it, where one did.
  auto checked = [&](const auto& parse) {
    try {
      return parse();
    } catch (const ArgumentError& e) {
      if (source.rfind("--", 0) == 0) throw;
      const std::string what = e.what();  // "--nnodes: expected ..."
      const auto colon = what.find(':');
      throw ArgumentError(source + " (for " + what.substr(0, colon) + ")" + what.substr(colon));
    }
  };
  if (auto v = text("nproc-per-node")) {
    o.nproc_per_node = checked([&] { return parse_nproc(*v, gpu_count); });
  }
  if (auto v = text("nnodes"))
    o.nnodes = checked([&] { return parse_int("nnodes", *v, 1, 1 << 20); });
  if (auto v = text("node-rank")) {
    o.node_rank = checked([&] { return parse_int("node-rank", *v, 0, 1 << 20); });
  }
  if (auto v = text("master-addr")) {
    if (v->empty()) throw ArgumentError(source + ": empty host name");
    o.master_addr = *v;
  }
  if (auto v = text("master-port")) {
    o.master_port = checked([&] { return parse_int("master-port", *v, 1, 65535); });
  }
  if (auto v = text("max-restarts")) {
    o.max_restarts = checked([&] { return parse_int("max-restarts", *v, 0, 1 << 20); });
  }
  if (auto v = text("log-dir")) o.log_dir = *v;
  if (auto v = text("local-ranks-filter")) o.local_ranks_filter = parse_ranks(*v);
  o.prefix = parsed.count("no-prefix") == 0;
  if (auto v = text("grace-period")) {
    char* end = nullptr;
    o.grace_s = std::strtod(v->c_str(), &end);
    if (v->empty() || *end != '\0' || !std::isfinite(o.grace_s) || o.grace_s < 0) {
      throw ArgumentError("--grace-period: expected seconds >= 0, got '" + *v + "'");
    }
  }
}

}  // namespace

int parse_nproc(const std::string& text, const std::function<int()>& gpu_count) {
  if (text == "cpu") return cpu_count();
  if (text == "gpu" || text == "auto") {
    const int gpus = gpu_count ? gpu_count() : 0;
    if (gpus > 0) return gpus;
    if (text == "gpu") throw ArgumentError("--nproc-per-node gpu: no CUDA device is available");
    return 1;  // auto without a GPU: one process (cpu: one per CPU)
  }
  return parse_int("nproc-per-node", text, 1, 1 << 16);
}

LaunchCommand parse_launch_args(const std::vector<std::string>& args,
                                const std::function<int()>& gpu_count) {
  const auto separator = std::find(args.begin(), args.end(), "--");
  std::vector<std::string> own;
  for (auto it = args.begin(); it != separator; ++it) own.push_back(normalise(*it));
  const cxxopts::ParseResult parsed = parse_own(own);
  LaunchCommand command;
  if (parsed.count("help")) {
    command.help = true;
    return command;
  }
  LaunchOptions& o = command.options;
  read_options(parsed, gpu_count, o);
  if (parsed.count("standalone")) make_standalone(parsed, o);
  if (o.node_rank >= o.nnodes) {
    throw ArgumentError("--node-rank " + std::to_string(o.node_rank) +
                        " is out of range for --nnodes " + std::to_string(o.nnodes) + " (0.." +
                        std::to_string(o.nnodes - 1) + ")");
  }
  for (const int r : o.local_ranks_filter) {
    if (r >= o.nproc_per_node) {
      throw ArgumentError("--local-ranks-filter: local rank " + std::to_string(r) +
                          " is out of range for --nproc-per-node " +
                          std::to_string(o.nproc_per_node) + " (0.." +
                          std::to_string(o.nproc_per_node - 1) + ")");
    }
  }
  if (separator == args.end() || separator + 1 == args.end()) {
    throw ArgumentError("no trainer arguments: trainer launch [options] -- <trainer arguments>");
  }
  o.args.assign(separator + 1, args.end());
  return command;
}

int run(const LaunchOptions& options, std::ostream& out, std::ostream& err, std::ostream& log) {
  check(options);
  auto env = launcher_env();
  if (options.nproc_per_node > 1 && std::getenv("OMP_NUM_THREADS") == nullptr) {
    env.emplace_back("OMP_NUM_THREADS", "1");
    log << "trainer launch: OMP_NUM_THREADS is unset; setting it to 1 for each worker so that "
           "they do not overload the CPUs (set it to tune)\n";
  }
  if (!options.log_dir.empty()) std::filesystem::create_directories(options.log_dir);
  const int world = options.nnodes * options.nproc_per_node;
  const int first_rank = options.node_rank * options.nproc_per_node;
  log << "trainer launch: node " << options.node_rank << " of " << options.nnodes << ", ranks "
      << first_rank << ".." << first_rank + options.nproc_per_node - 1 << " of " << world
      << ", master " << options.master_addr << ":" << options.master_port << ", run id "
      << options.run_id << "\n";
  for (const auto& line : options.from_environment) log << "trainer launch: " << line << "\n";
  log.flush();

  return supervise(options, env, out, err, log);
}

}  // namespace trainer::launch
