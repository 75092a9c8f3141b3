// trainer launch: starts one node's workers of a distributed run the way torchrun does (same
// environment variables, same flags), passes their output through with a rank prefix, stops the
// whole group when one worker fails and restarts it up to a limit. Torch-free.
//
// While it runs, run() handles SIGINT, SIGTERM and SIGCHLD and makes the process a child subreaper
// (PR_SET_CHILD_SUBREAPER), so that it can reap what the workers leave behind; both settings are
// restored before it returns. Only one run() may be active in a process at a time, and it must be
// called from a thread that outlives the workers: they get PR_SET_PDEATHSIG, which fires when the
// thread that started them exits. Each worker leads its own process group; signals go to the group.
#pragma once

#include <functional>
#include <iosfwd>
#include <stdexcept>
#include <string>
#include <vector>

namespace trainer::launch {

// A bad `trainer launch` command line: one line naming the flag (a usage error, exit 2).
class ArgumentError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// What one node starts and how its workers find the others.
struct LaunchOptions {
  std::string program;            // the executable every worker runs (a path, no PATH search)
  std::vector<std::string> args;  // its arguments, argv[0] excluded
  int nproc_per_node = 1;         // workers on this node
  int nnodes = 1;                 // nodes in the run
  int node_rank = 0;              // this node's index, in [0, nnodes)
  std::string master_addr = "127.0.0.1";  // host of rank 0 (MASTER_ADDR)
  int master_port = 29500;                // its rendezvous port (MASTER_PORT)
  int max_restarts = 0;                   // times the group is started again after a failure
  std::string run_id = "none";            // TORCHELASTIC_RUN_ID, the same for every restart
  std::string log_dir;  // each rank's output also goes to rank_<N>.log here (its stdout alone
                        // to rank_<N>.stdout)
  double grace_s = 10;  // seconds from SIGTERM to SIGKILL when stopping workers
  std::vector<int> local_ranks_filter;  // the local ranks whose output the console shows; empty:
                                        // every rank (log files keep every rank's)
  bool prefix = true;                   // console lines start with "[rank<N>]: "
  std::vector<std::string> from_environment;  // the values a scheduler's variables gave
                                              // ("--nnodes 2 from PET_NNODES"), logged by run()
};

// The command line of `trainer launch`, parsed.
struct LaunchCommand {
  LaunchOptions options;  // program left empty: the caller names its own executable
  bool help = false;      // --help was given; nothing else was checked
};

// Parses the arguments after "launch":
//   [--nproc-per-node N|auto|gpu|cpu] [--nnodes N] [--node-rank R] [--master-addr HOST]
//   [--master-port PORT] [--max-restarts K] [--standalone] [--log-dir DIR] [--grace-period S]
//   [--local-ranks-filter R[,R...]] [--no-prefix] -- <worker arguments>
// Underscore spellings (--nproc_per_node, ...) are accepted. --nproc-per-node as parse_nproc
// reads it. A flag left out takes the value a scheduler sets (not with --standalone): torchrun's
// PET_NPROC_PER_NODE, PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT,
// PET_MAX_RESTARTS (what Kubeflow Trainer's TrainJob sets), else the node layout of a Volcano or
// Kubeflow PyTorchJob pod (WORLD_SIZE pods, RANK this one, MASTER_ADDR, MASTER_PORT; recognised
// when WORLD_SIZE, RANK and MASTER_ADDR are set and LOCAL_RANK is not); a bad value names the
// variable.
// --standalone: one node on 127.0.0.1, a free port and a random run id. Throws ArgumentError
// with one line naming the flag.
LaunchCommand parse_launch_args(const std::vector<std::string>& args,
                                const std::function<int()>& gpu_count);

// Processes per node for `text`: a number >= 1; "auto": gpu_count() when positive, else 1 (what
// `trainer --nproc-per-node auto` means too); "gpu": gpu_count(), which must be positive; "cpu":
// the CPU count. gpu_count is called only for auto and gpu. Throws ArgumentError naming
// --nproc-per-node.
int parse_nproc(const std::string& text, const std::function<int()>& gpu_count);

// The --help text of `trainer launch`.
std::string launch_help();

// Starts options.nproc_per_node workers and supervises them until they have all exited, restarting
// the group after a failure while restarts remain. Worker stdout lines go to out and stderr lines
// to err, each prefixed with "[rank<N>]: " (unless options.prefix is false), those of the ranks
// options.local_ranks_filter names (every rank when it is empty); the launcher's own messages go
// to log. Returns the
// launcher's exit code: 0 when every worker exited 0 (also after a forwarded SIGINT/SIGTERM), 2
// when the failing worker exited 2 (not restarted), else 1. Throws std::invalid_argument for
// inconsistent options and std::system_error when the operating system refuses a pipe, fork or
// directory.
int run(const LaunchOptions& options, std::ostream& out, std::ostream& err, std::ostream& log);

// "SIGKILL" for 9; "signal N" for a number without a name.
std::string signal_name(int sig);

}  // namespace trainer::launch
