// Where this process sits in a distributed job, read from the environment its launcher set:
// torchrun and `trainer launch` (RANK, WORLD_SIZE, ...), SLURM's srun (SLURM_PROCID, ...) or
// Open MPI's mpirun (OMPI_COMM_WORLD_*). No LibTorch here.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>

namespace trainer::distributed {

// A launcher's variables that do not describe a valid job: exit 2, naming the variable.
class EnvError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct DistEnv {
  std::string source;  // "torchrun", "trainer launch", "slurm", "mpi"; "" = not launched
  int rank = 0;                           // global rank, 0..world_size-1
  int world_size = 1;                     // processes in the job
  int local_rank = 0;                     // rank among the processes of this node
  int local_world_size = 1;               // processes on this node
  std::string master_addr = "127.0.0.1";  // host of rank 0's rendezvous store
  int master_port = 29500;                // its port
  int restart_count = 0;                  // times the launcher restarted the group

  // Started by a launcher: training goes through a process group even at world size 1.
  bool launched() const { return !source.empty(); }
};

// Looks a variable up; nullptr when unset.
using GetEnv = std::function<const char*(const char* name)>;

// Reads the job's layout. torchrun's variables win over SLURM's, SLURM's over Open MPI's; none
// of them gives a single process (source ""). Throws EnvError for a malformed or inconsistent
// value (a rank outside the world size, a port that is not a port, ...).
DistEnv read_env(const GetEnv& getenv);

// read_env on the process's own environment.
DistEnv read_process_env();

// The first host of a SLURM node list: "gpu[03-05,09],login1" -> "gpu03".
std::string first_slurm_host(const std::string& nodelist);

}  // namespace trainer::distributed
