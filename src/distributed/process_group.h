// A process group over LibTorch's c10d: the rendezvous of every rank through a TCPStore on
// MASTER_ADDR:MASTER_PORT, then Gloo (CPU) or NCCL (CUDA) collectives.
#pragma once

#include <torch/types.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "distributed/comm_bytes.h"
#include "distributed/env.h"

namespace c10d {
class ProcessGroup;
}

namespace trainer::distributed {

// The job could not form or lost its process group (a rank missing, a port in use, a collective
// that timed out or lost a peer): one line naming the address, the rank and what was expected.
class GroupError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct GroupOptions {
  std::string backend = "gloo";       // gloo|nccl
  torch::Device device{torch::kCPU};  // where this rank trains: NCCL's collectives run there
  double init_timeout_s = 300;        // how long the rendezvous waits for every rank
  double timeout_s = 600;             // how long one collective may take
};

enum class Reduce { sum, avg, max };

// A collective in flight (Group::all_reduce_async).
class Pending {
 public:
  struct Impl;
  explicit Pending(std::unique_ptr<Impl> impl);
  Pending(Pending&&) noexcept;
  Pending& operator=(Pending&&) noexcept;
  ~Pending();
  // Returns when the collective is done and its result is in the tensors; throws GroupError.
  void wait();

 private:
  std::unique_ptr<Impl> impl_;
};

class Group {
 public:
  // Meets the other env.world_size - 1 ranks (rank 0 hosts the store) and builds the backend.
  // Throws GroupError when they do not all arrive within init_timeout_s, when their world sizes
  // or ranks disagree, or when rank 0 cannot listen on the port. Every rank must construct it.
  Group(const DistEnv& env, const GroupOptions& options);
  ~Group();
  // The group of `ranks` (ranks of `parent`'s job, this rank among them, in group-rank order)
  // over `parent`'s rendezvous store: tensor-parallel groups of consecutive ranks, data-parallel
  // groups across them. Every rank in `ranks` must create it with the same `ranks` and `name`
  // (unique among the job's groups), in the same order relative to its other group creations;
  // ranks outside it do not take part. Throws GroupError when this rank is not in `ranks` or
  // the group cannot be formed within dist.init_timeout_s.
  Group(const Group& parent, const std::vector<int>& ranks, const std::string& name);
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  int rank() const;
  int world_size() const;
  const std::string& backend() const;
  // Where tensors given to this group's collectives live (the training device with NCCL).
  torch::Device device() const;

  // The collectives. Every rank must call each, in the same order, with tensors of the same
  // shapes and dtypes.

  // In place on every rank; one collective for all `tensors` (same device and dtype).
  void all_reduce(std::vector<torch::Tensor> tensors, Reduce op);
  // all_reduce started without waiting: the tensors must stay untouched until wait() returns.
  Pending all_reduce_async(std::vector<torch::Tensor> tensors, Reduce op);
  // Every rank's `input` into `outputs` (world_size tensors of input's shape, in rank order).
  void all_gather(const torch::Tensor& input, std::vector<torch::Tensor> outputs);
  // Every rank's `input` (contiguous, n elements) into the contiguous `output` (world_size * n
  // elements, rank r's at r * n), started without waiting: `input` and `output` must stay
  // untouched until wait() returns.
  Pending all_gather_into_async(const torch::Tensor& output, const torch::Tensor& input);
  // The sum over the ranks of `input` (contiguous, world_size * n elements), rank r receiving
  // elements [r * n, (r + 1) * n) into `output` (n elements), started without waiting.
  Pending reduce_scatter_async(const torch::Tensor& output, const torch::Tensor& input);
  // Rank `root`'s values into every rank's `tensors`, coalesced into few messages.
  void broadcast(std::vector<torch::Tensor> tensors, int root = 0);
  // Rank `root`'s `text` on every rank. Synchronises the device (reads the length back).
  std::string broadcast_text(const std::string& text, int root = 0);
  // Returns when every rank has called it.
  void barrier();

  // The c10d process group, for c10d's Reducer (distributed/ddp.cpp).
  c10d::ProcessGroup& c10d();

  // What this group's collectives have moved so far, with the all-reduces recorded below.
  CommBytes communicated() const;
  // Counts `bytes` of all-reduce run on c10d() directly (c10d's Reducer, DDP's gradients).
  void record_all_reduce(int64_t bytes);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainer::distributed
