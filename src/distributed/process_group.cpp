#include "distributed/process_group.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "util/device.h"
#include "util/error_text.h"
#include "util/format.h"
#include "util/net/net.h"

namespace trainer::distributed {
namespace {

using Ms = std::chrono::milliseconds;

Ms millis(double seconds) {
  return Ms(static_cast<int64_t>(seconds * 1000.0));
}

// The first line of a c10d error, without its C++ backtrace.
std::string text_of(const std::vector<uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

std::vector<uint8_t> bytes_of(const std::string& text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}

// Broadcasts are coalesced into messages of this size.
constexpr size_t kBroadcastBytes = size_t{256} << 20;

}  // namespace

struct Group::Impl {
  DistEnv env;
  GroupOptions options;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  std::string name = "pg";  // the store prefix of the group's backend; a sub-group's own
  CommBytes moved;          // by the collectives so far (the calling thread's alone: not atomic)

  std::string where() const { return env.master_addr + ":" + std::to_string(env.master_port); }

  // Waits for one collective; a timeout or a lost peer becomes a GroupError.
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const char* what) const {
    try {
      work->wait();
    } catch (const std::exception& e) {
      throw GroupError(
          strprintf("rank %d: %s across %d ranks failed: %s (another rank ended or is stuck; "
                    "dist.timeout_s is %g s)",
                    env.rank, what, env.world_size, without_source_paths(error_line(e)).c_str(),
                    options.timeout_s));
    }
  }

  void connect();
  void rendezvous();
  // ": missing ranks 2-3 (node 1, at 2 processes a node)": the ranks that have not joined the
  // rendezvous `run` (none: ""). Reads the store.
  std::string missing_ranks(const std::string& run) const;
  void build_backend();
  std::shared_ptr<::gloo::transport::Device> gloo_device() const;
};

// The bytes of `tensors` together.
int64_t bytes_of(const std::vector<torch::Tensor>& tensors) {
  int64_t n = 0;
  for (const auto& t : tensors) n += static_cast<int64_t>(t.nbytes());
  return n;
}

void Group::Impl::connect() {
  // Ranks other than 0 wait for rank 0's store themselves, within dist.init_timeout_s, so that
  // c10d's client neither retries past the timeout nor logs its failures.
  if (env.rank != 0 &&
      !wait_for_listener(env.master_addr, env.master_port, options.init_timeout_s)) {
    throw GroupError(strprintf(
        "rank %d could not reach the rendezvous at %s within %g s (dist.init_timeout_s); check "
        "that rank 0 is running and MASTER_ADDR/MASTER_PORT point at it",
        env.rank, where().c_str(), options.init_timeout_s));
  }
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(env.master_port);
  o.isServer = env.rank == 0;
  o.numWorkers = static_cast<size_t>(env.world_size);
  o.waitWorkers = false;  // the arrival count below says who is missing
  o.timeout = millis(options.init_timeout_s);
  try {
    store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, o);
  } catch (const std::exception& e) {
    const std::string why = error_line(e);
    if (env.rank == 0) {
      const bool in_use = why.find("EADDRINUSE") != std::string::npos ||
                          why.find("address already in use") != std::string::npos ||
                          why.find("Address already in use") != std::string::npos;
      throw GroupError(
          strprintf("rank 0 cannot host the rendezvous on port %d%s: %s; pick a free port with "
                    "--master-port (or MASTER_PORT), or use trainer launch --standalone",
                    env.master_port, in_use ? " (the port is in use)" : "", why.c_str()));
    }
    throw GroupError(strprintf(
        "rank %d could not reach the rendezvous at %s within %g s (dist.init_timeout_s): %s; "
        "check that rank 0 is running and MASTER_ADDR/MASTER_PORT point at it",
        env.rank, where().c_str(), options.init_timeout_s, why.c_str()));
  }
}

std::string Group::Impl::missing_ranks(const std::string& run) const {
  std::vector<int> missing;
  for (int r = 0; r < env.world_size; ++r) {
    if (!store->check({run + "rank/" + std::to_string(r)})) missing.push_back(r);
  }
  if (missing.empty()) return "";
  // Ranks in runs ("4-7"), and the nodes they are on, node = rank / processes per node.
  const int per_node = std::max(env.local_world_size, 1);
  std::string ranks, nodes;
  int last_node = -1;
  for (size_t i = 0; i < missing.size();) {
    size_t j = i;
    while (j + 1 < missing.size() && missing[j + 1] == missing[j] + 1) ++j;
    ranks += (ranks.empty() ? "" : ",") + std::to_string(missing[i]) +
             (j > i ? "-" + std::to_string(missing[j]) : "");
    for (size_t k = i; k <= j; ++k) {
      if (missing[k] / per_node == last_node) continue;
      last_node = missing[k] / per_node;
      nodes += (nodes.empty() ? "" : ",") + std::to_string(last_node);
    }
    i = j + 1;
  }
  return strprintf(": missing rank%s %s (node%s %s, at %d process%s a node)",
                   missing.size() == 1 ? "" : "s", ranks.c_str(),
                   nodes.find(',') == std::string::npos ? "" : "s", nodes.c_str(), per_node,
                   per_node == 1 ? "" : "es");
}

void Group::Impl::rendezvous() {
  const std::string run = "trainer/" + std::to_string(env.restart_count) + "/";
  try {
    // The world size and the ranks must agree before anyone counts as arrived.
    if (env.rank == 0) store->set(run + "world_size", bytes_of(std::to_string(env.world_size)));
    const std::string theirs = text_of(store->get(run + "world_size"));
    if (theirs != std::to_string(env.world_size)) {
      throw GroupError(strprintf(
          "rank %d was started with world size %d but rank 0 at %s with %s; start every rank "
          "with the same WORLD_SIZE",
          env.rank, env.world_size, where().c_str(), theirs.c_str()));
    }
    if (store->add(run + "rank/" + std::to_string(env.rank), 1) != 1) {
      throw GroupError(strprintf("two processes joined %s as rank %d; every rank must be unique",
                                 where().c_str(), env.rank));
    }
    store->add(run + "arrived", 1);
    const auto deadline = std::chrono::steady_clock::now() + millis(options.init_timeout_s);
    for (int64_t arrived = 0;;) {
      arrived = store->add(run + "arrived", 0);
      if (arrived >= env.world_size) break;
      if (std::chrono::steady_clock::now() > deadline) {
        throw GroupError(
            strprintf("rendezvous at %s: %" PRId64
                      " of %d ranks arrived within %g s (dist.init_timeout_s)%s; "
                      "start all %d ranks with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE",
                      where().c_str(), static_cast<int64_t>(arrived), env.world_size,
                      options.init_timeout_s, missing_ranks(run).c_str(), env.world_size));
      }
      std::this_thread::sleep_for(Ms(20));
    }
  } catch (const GroupError&) {
    throw;
  } catch (const std::exception& e) {
    throw GroupError(strprintf("rank %d: the rendezvous at %s failed: %s", env.rank,
                               where().c_str(), error_line(e).c_str()));
  }
  store->setTimeout(millis(options.timeout_s));
}

// The interface Gloo's connections use. GLOO_SOCKET_IFNAME picks it, as in torch.distributed.
// Else, with a master on another machine, the address this machine reaches the master through:
// the host name (torch.distributed's choice) may resolve to a loopback address (Debian's
// 127.0.1.1), which the other nodes cannot reach. With a master on this machine, the host's.
std::shared_ptr<::gloo::transport::Device> Group::Impl::gloo_device() const {
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifname && *ifname) return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  if (!is_loopback(env.master_addr)) {
    const std::string local = local_address_toward(env.master_addr, env.master_port);
    if (!local.empty()) return c10d::ProcessGroupGloo::createDeviceForHostname(local);
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

void Group::Impl::build_backend() {
  auto prefix = c10::make_intrusive<c10d::PrefixStore>(
      "trainer/" + std::to_string(env.restart_count) + "/" + name, store);
  pg = c10::make_intrusive<c10d::ProcessGroup>(prefix, env.rank, env.world_size);
  const Ms timeout = millis(options.timeout_s);
  if (options.backend == "nccl") {
#ifdef USE_C10D_NCCL
    auto o = c10d::ProcessGroupNCCL::Options::create();
    o->timeout = timeout;
    auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefix, env.rank, env.world_size, o);
    nccl->setSequenceNumberForGroup();
    pg->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
    pg->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, nccl);
    return;
#else
    throw GroupError("dist.backend nccl: this LibTorch was built without CUDA; use gloo");
#endif
  }
  auto o = c10d::ProcessGroupGloo::Options::create(timeout);
  o->devices.push_back(gloo_device());
  auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(prefix, env.rank, env.world_size, o);
  gloo->setSequenceNumberForGroup();
  pg->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
  pg->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::GLOO, gloo);
}

Group::Group(const DistEnv& env, const GroupOptions& options) : impl_(std::make_unique<Impl>()) {
  impl_->env = env;
  impl_->options = options;
  impl_->connect();
  impl_->rendezvous();
  try {
    impl_->build_backend();
  } catch (const GroupError&) {
    throw;
  } catch (const std::exception& e) {
    throw GroupError(strprintf("rank %d: the %s process group over %s could not be formed: %s",
                               env.rank, options.backend.c_str(), impl_->where().c_str(),
                               error_line(e).c_str()));
  }
}

Group::Group(const Group& parent, const std::vector<int>& ranks, const std::string& name)
    : impl_(std::make_unique<Impl>()) {
  const Impl& p = *parent.impl_;
  const auto me = std::find(ranks.begin(), ranks.end(), p.env.rank);
  if (me == ranks.end()) {
    throw GroupError(strprintf("rank %d is not in the group '%s' it was asked to create",
                               p.env.rank, name.c_str()));
  }
  impl_->env = p.env;
  impl_->env.rank = static_cast<int>(me - ranks.begin());
  impl_->env.world_size = static_cast<int>(ranks.size());
  impl_->options = p.options;
  impl_->store = p.store;
  impl_->name = "group/" + name;
  try {
    impl_->build_backend();
  } catch (const std::exception& e) {
    throw GroupError(strprintf("rank %d: the %s group '%s' of %zu ranks could not be formed: %s",
                               p.env.rank, impl_->options.backend.c_str(), name.c_str(),
                               ranks.size(), error_line(e).c_str()));
  }
}

Group::~Group() = default;

int Group::rank() const {
  return impl_->env.rank;
}

int Group::world_size() const {
  return impl_->env.world_size;
}

const std::string& Group::backend() const {
  return impl_->options.backend;
}

torch::Device Group::device() const {
  return impl_->options.backend == "nccl" ? impl_->options.device : torch::Device(torch::kCPU);
}

struct Pending::Impl {
  const Group::Impl* group = nullptr;
  c10::intrusive_ptr<c10d::Work> work;
  std::vector<torch::Tensor> tensors;  // kept alive (and averaged) until the collective ends
  bool average = false;
  const char* what = "all-reduce";
};

Pending::Pending(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Pending::Pending(Pending&&) noexcept = default;
Pending& Pending::operator=(Pending&&) noexcept = default;
Pending::~Pending() = default;

void Pending::wait() {
  if (!impl_ || !impl_->work) return;
  impl_->group->wait(impl_->work, impl_->what);
  impl_->work.reset();
  if (impl_->average) {
    for (auto& t : impl_->tensors) t.div_(impl_->group->env.world_size);
  }
}

Pending Group::all_reduce_async(std::vector<torch::Tensor> tensors, Reduce op) {
  auto pending = std::make_unique<Pending::Impl>();
  pending->group = impl_.get();
  pending->average = op == Reduce::avg;
  pending->tensors = tensors;
  impl_->moved.all_reduce += bytes_of(tensors);
  if (!tensors.empty()) {
    // Gloo has no average: sum, then divide.
    const auto reduce = op == Reduce::max ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
    if (tensors.size() == 1) {
      c10d::AllreduceOptions o;
      o.reduceOp = reduce;
      pending->work = impl_->pg->allreduce(tensors, o);
    } else {
      c10d::AllreduceCoalescedOptions o;
      o.reduceOp = reduce;
      pending->work = impl_->pg->allreduce_coalesced(tensors, o);
    }
  }
  return Pending(std::move(pending));
}

void Group::all_reduce(std::vector<torch::Tensor> tensors, Reduce op) {
  all_reduce_async(std::move(tensors), op).wait();
}

// A collective of one input and one output tensor, started by `start(output, input)`.
template <class Start>
Pending one_to_one(Group::Impl* group, const char* what, const torch::Tensor& output,
                   const torch::Tensor& input, const Start& start) {
  auto pending = std::make_unique<Pending::Impl>();
  pending->group = group;
  pending->what = what;
  pending->tensors = {output, input};
  auto out = output;
  auto in = input;
  pending->work = start(out, in);
  return Pending(std::move(pending));
}

Pending Group::all_gather_into_async(const torch::Tensor& output, const torch::Tensor& input) {
  impl_->moved.all_gather += static_cast<int64_t>(output.nbytes());
  return one_to_one(
      impl_.get(), "all-gather", output, input,
      [&](torch::Tensor& out, torch::Tensor& in) { return impl_->pg->_allgather_base(out, in); });
}

Pending Group::reduce_scatter_async(const torch::Tensor& output, const torch::Tensor& input) {
  impl_->moved.reduce_scatter += static_cast<int64_t>(input.nbytes());
  return one_to_one(impl_.get(), "reduce-scatter", output, input,
                    [&](torch::Tensor& out, torch::Tensor& in) {
                      c10d::ReduceScatterOptions o;
                      o.reduceOp = c10d::ReduceOp::SUM;
                      return impl_->pg->_reduce_scatter_base(out, in, o);
                    });
}

void Group::all_gather(const torch::Tensor& input, std::vector<torch::Tensor> outputs) {
  impl_->moved.all_gather += bytes_of(outputs);
  std::vector<std::vector<torch::Tensor>> out{std::move(outputs)};
  std::vector<torch::Tensor> in{input};
  impl_->wait(impl_->pg->allgather(out, in), "all_gather");
}

void Group::broadcast(std::vector<torch::Tensor> tensors, int root) {
  if (tensors.empty()) return;
  impl_->moved.broadcast += bytes_of(tensors);
  try {
    c10d::broadcast_coalesced(impl_->pg, tensors, kBroadcastBytes, root);
  } catch (const std::exception& e) {
    throw GroupError(
        strprintf("rank %d: broadcast from rank %d failed: %s (another rank ended or is stuck; "
                  "dist.timeout_s is %g s)",
                  impl_->env.rank, root, without_source_paths(error_line(e)).c_str(),
                  impl_->options.timeout_s));
  }
}

std::string Group::broadcast_text(const std::string& text, int root) {
  const auto on = torch::TensorOptions().device(device());
  auto size = torch::full({1}, static_cast<int64_t>(text.size()), on.dtype(torch::kLong));
  broadcast({size}, root);
  const int64_t length = host_int(size);
  if (length == 0) return "";
  auto bytes = torch::from_blob(const_cast<char*>(text.data()), {static_cast<int64_t>(text.size())},
                                torch::kUInt8)
                   .to(on.dtype(torch::kUInt8), /*non_blocking=*/false, /*copy=*/true);
  if (impl_->env.rank != root) bytes = torch::empty({length}, on.dtype(torch::kUInt8));
  broadcast({bytes}, root);
  bytes = read_to_host(bytes);
  return std::string(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()),
                     static_cast<size_t>(bytes.numel()));
}

void Group::barrier() {
  impl_->wait(impl_->pg->barrier(), "barrier");
}

c10d::ProcessGroup& Group::c10d() {
  return *impl_->pg;
}

CommBytes Group::communicated() const {
  return impl_->moved;
}

void Group::record_all_reduce(int64_t bytes) {
  impl_->moved.all_reduce += bytes;
}

}  // namespace trainer::distributed
