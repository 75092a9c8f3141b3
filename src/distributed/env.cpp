#include "distributed/env.h"

#include <cstdlib>
#include <limits>
#include <vector>

namespace trainer::distributed {
namespace {

// A non-negative integer variable; `fallback` when unset.
int int_var(const GetEnv& getenv, const char* name, int fallback) {
  const char* v = getenv(name);
  if (v == nullptr) return fallback;
  const std::string text(v);
  size_t used = 0;
  long long n = -1;
  try {
    n = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (text.empty() || used != text.size() || n < 0 || n > std::numeric_limits<int>::max()) {
    throw EnvError(std::string("environment variable ") + name + "='" + text +
                   "' is not a non-negative integer");
  }
  return static_cast<int>(n);
}

std::string str_var(const GetEnv& getenv, const char* name, const std::string& fallback) {
  const char* v = getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

// SLURM's task counts per node: "2(x3),1" -> {2, 2, 2, 1}.
std::vector<int> slurm_tasks_per_node(const std::string& text) {
  std::vector<int> out;
  size_t i = 0;
  while (i < text.size()) {
    size_t end = text.find(',', i);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(i, end - i);
    const int count = std::atoi(item.c_str());
    int repeat = 1;
    if (const size_t x = item.find("(x"); x != std::string::npos) {
      repeat = std::atoi(item.c_str() + x + 2);
    }
    for (int r = 0; r < repeat; ++r) out.push_back(count);
    i = end + 1;
  }
  return out;
}

}  // namespace

std::string first_slurm_host(const std::string& nodelist) {
  // The first entry ends at a comma outside brackets.
  size_t end = 0;
  int depth = 0;
  for (; end < nodelist.size(); ++end) {
    if (nodelist[end] == '[') ++depth;
    if (nodelist[end] == ']') --depth;
    if (nodelist[end] == ',' && depth == 0) break;
  }
  const std::string entry = nodelist.substr(0, end);
  const size_t open = entry.find('[');
  if (open == std::string::npos) return entry;
  const size_t close = entry.find(']', open);
  // The first number of the range list: "03-05,09" -> "03" (zero padding kept).
  const std::string ranges = entry.substr(open + 1, close - open - 1);
  const size_t stop = ranges.find_first_of("-,");
  return entry.substr(0, open) + ranges.substr(0, stop) +
         (close == std::string::npos ? "" : entry.substr(close + 1));
}

DistEnv read_env(const GetEnv& getenv) {
  DistEnv e;
  if (getenv("RANK") != nullptr || getenv("WORLD_SIZE") != nullptr) {
    // trainer launch sets torchrun's variables and names itself.
    e.source = getenv("TRAINER_LAUNCHER") != nullptr ? "trainer launch" : "torchrun";
    e.rank = int_var(getenv, "RANK", 0);
    e.world_size = int_var(getenv, "WORLD_SIZE", 1);
    e.local_rank = int_var(getenv, "LOCAL_RANK", e.rank);
    e.local_world_size = int_var(getenv, "LOCAL_WORLD_SIZE", e.world_size);
  } else if (getenv("SLURM_PROCID") != nullptr && getenv("SLURM_NTASKS") != nullptr) {
    e.source = "slurm";
    e.rank = int_var(getenv, "SLURM_PROCID", 0);
    e.world_size = int_var(getenv, "SLURM_NTASKS", 1);
    e.local_rank = int_var(getenv, "SLURM_LOCALID", 0);
    const std::string per_node = str_var(getenv, "SLURM_TASKS_PER_NODE", "");
    const auto counts = slurm_tasks_per_node(str_var(getenv, "SLURM_NTASKS_PER_NODE", per_node));
    const size_t node = static_cast<size_t>(int_var(getenv, "SLURM_NODEID", 0));
    e.local_world_size = node < counts.size() && counts[node] > 0 ? counts[node] : 1;
    const std::string nodes =
        str_var(getenv, "SLURM_JOB_NODELIST", str_var(getenv, "SLURM_NODELIST", ""));
    if (getenv("MASTER_ADDR") == nullptr && !nodes.empty()) {
      e.master_addr = first_slurm_host(nodes);
    }
  } else if (getenv("OMPI_COMM_WORLD_RANK") != nullptr) {
    e.source = "mpi";
    e.rank = int_var(getenv, "OMPI_COMM_WORLD_RANK", 0);
    e.world_size = int_var(getenv, "OMPI_COMM_WORLD_SIZE", 1);
    e.local_rank = int_var(getenv, "OMPI_COMM_WORLD_LOCAL_RANK", 0);
    e.local_world_size = int_var(getenv, "OMPI_COMM_WORLD_LOCAL_SIZE", 1);
    if (getenv("MASTER_ADDR") == nullptr && e.local_world_size < e.world_size) {
      throw EnvError(
          "an mpirun job over several nodes needs MASTER_ADDR, the host of rank 0 (mpirun -x "
          "MASTER_ADDR=<host>)");
    }
  } else {
    return e;
  }
  e.master_addr = str_var(getenv, "MASTER_ADDR", e.master_addr);
  e.master_port = int_var(getenv, "MASTER_PORT", e.master_port);
  e.restart_count = int_var(getenv, "TORCHELASTIC_RESTART_COUNT", 0);
  const std::string vars =
      e.source == "torchrun" || e.source == "trainer launch" ? "RANK/WORLD_SIZE"
                             : (e.source == "slurm" ? "SLURM_PROCID/SLURM_NTASKS"
                                                    : "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE");
  if (e.world_size < 1) throw EnvError("environment: the world size (" + vars + ") is 0");
  if (e.rank >= e.world_size) {
    throw EnvError("environment: rank " + std::to_string(e.rank) + " is not below the world size " +
                   std::to_string(e.world_size) + " (" + vars + ")");
  }
  if (e.local_world_size < 1 || e.local_rank >= e.local_world_size) {
    throw EnvError("environment: local rank " + std::to_string(e.local_rank) +
                   " is not below the local world size " + std::to_string(e.local_world_size));
  }
  if (e.master_port < 1 || e.master_port > 65535) {
    throw EnvError("environment variable MASTER_PORT=" + std::to_string(e.master_port) +
                   " is not a port (1-65535)");
  }
  return e;
}

DistEnv read_process_env() {
  return read_env([](const char* name) { return std::getenv(name); });
}

}  // namespace trainer::distributed
