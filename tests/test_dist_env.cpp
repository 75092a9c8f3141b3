// The job layout read from launcher variables (torchrun, SLURM, Open MPI).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "distributed/env.h"

namespace {

using trainer::distributed::DistEnv;
using trainer::distributed::EnvError;

DistEnv read(const std::map<std::string, std::string>& vars) {
  return trainer::distributed::read_env([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

TEST(DistEnv, NoLauncherIsOneProcess) {
  const DistEnv e = read({{"PATH", "/bin"}});
  EXPECT_FALSE(e.launched());
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.rank, 0);
}

TEST(DistEnv, TorchrunVariables) {
  const DistEnv e = read({{"RANK", "3"},
                          {"WORLD_SIZE", "4"},
                          {"LOCAL_RANK", "1"},
                          {"LOCAL_WORLD_SIZE", "2"},
                          {"MASTER_ADDR", "node7"},
                          {"MASTER_PORT", "1234"},
                          {"TORCHELASTIC_RESTART_COUNT", "2"},
                          // SLURM's own variables are present inside an allocation too.
                          {"SLURM_PROCID", "0"},
                          {"SLURM_NTASKS", "1"}});
  EXPECT_EQ(e.source, "torchrun");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.master_addr, "node7");
  EXPECT_EQ(e.master_port, 1234);
  EXPECT_EQ(e.restart_count, 2);
}

TEST(DistEnv, SlurmVariablesAndTheFirstHost) {
  const DistEnv e = read({{"SLURM_PROCID", "5"},
                          {"SLURM_NTASKS", "6"},
                          {"SLURM_LOCALID", "1"},
                          {"SLURM_NODEID", "2"},
                          {"SLURM_TASKS_PER_NODE", "2(x3)"},
                          {"SLURM_JOB_NODELIST", "gpu[03-05],login1"}});
  EXPECT_EQ(e.source, "slurm");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 6);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.master_addr, "gpu03");
  EXPECT_EQ(e.master_port, 29500);
  // MASTER_ADDR set by the job script wins over the node list.
  EXPECT_EQ(read({{"SLURM_PROCID", "0"},
                  {"SLURM_NTASKS", "2"},
                  {"SLURM_JOB_NODELIST", "a,b"},
                  {"MASTER_ADDR", "10.0.0.1"}})
                .master_addr,
            "10.0.0.1");
}

TEST(DistEnv, SlurmNodeLists) {
  using trainer::distributed::first_slurm_host;
  EXPECT_EQ(first_slurm_host("node1"), "node1");
  EXPECT_EQ(first_slurm_host("a,b,c"), "a");
  EXPECT_EQ(first_slurm_host("gpu[003-010,020]"), "gpu003");
  EXPECT_EQ(first_slurm_host("rack[7,9]-ib,login"), "rack7-ib");
}

TEST(DistEnv, OpenMpiVariables) {
  const DistEnv e = read({{"OMPI_COMM_WORLD_RANK", "1"},
                          {"OMPI_COMM_WORLD_SIZE", "2"},
                          {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                          {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  EXPECT_EQ(e.source, "mpi");
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.world_size, 2);
  EXPECT_EQ(e.master_addr, "127.0.0.1");
  // Across nodes rank 0's host cannot be guessed.
  EXPECT_THROW(read({{"OMPI_COMM_WORLD_RANK", "1"},
                     {"OMPI_COMM_WORLD_SIZE", "4"},
                     {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}),
               EnvError);
}

TEST(DistEnv, InconsistentValuesNameTheVariable) {
  auto message = [](const std::map<std::string, std::string>& vars) {
    try {
      read(vars);
    } catch (const EnvError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({{"RANK", "2"}, {"WORLD_SIZE", "2"}}).find("rank 2 is not below"),
            std::string::npos);
  EXPECT_NE(message({{"RANK", "x"}, {"WORLD_SIZE", "2"}}).find("RANK='x'"), std::string::npos);
  EXPECT_NE(message({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}})
                .find("MASTER_PORT=70000"),
            std::string::npos);
  EXPECT_NE(message({{"RANK", "0"}, {"WORLD_SIZE", "0"}}).find("world size"), std::string::npos);
}

}  // namespace
