#include "distributed/fsdp.h"

#include <ATen/ops/_chunk_cat.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <algorithm>
#include <stdexcept>

namespace trainer::distributed {
namespace {

int64_t round_up(int64_t n, int64_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

// Gives `t`'s storage `bytes` of fresh memory (every view of it sees the new memory).
void allocate_storage(const torch::Tensor& t, int64_t bytes) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  if (static_cast<int64_t>(s->nbytes()) == bytes) return;
  s->set_data_ptr_noswap(s->allocator()->allocate(static_cast<size_t>(bytes)));
  s->set_nbytes(static_cast<size_t>(bytes));
}

// Returns `t`'s storage's memory to the allocator; its views keep their shapes.
void free_storage(const torch::Tensor& t) {
  t.storage().unsafeGetStorageImpl()->reset();
}

}  // namespace

// A model parameter in its unit's flat buffer.
struct Slot {
  std::string name;
  torch::Tensor param;  // the model's tensor: a view of the unit's gathered buffer
  std::vector<int64_t> shape;
  int64_t offset = 0;  // in the flat buffer
  int64_t numel = 0;
  bool decay = true;
};

struct FullyShardedDataParallel::Unit {
  enum class State { resharded, gathering, gathered };
  bool frozen = false;      // parameters that get no gradient: gathered, never reduced or updated
  std::vector<Slot> slots;  // the decay ones first
  int64_t numel = 0;        // the parameters' elements
  int64_t padded = 0;       // numel rounded up to a multiple of the world size
  int64_t shard_numel = 0;  // padded / world size
  torch::Tensor shard;      // float32 (frozen: their dtype) [shard_numel]: this rank's elements
  torch::Tensor full;       // param_dtype [padded]: the gathered buffer, freed when resharded
  State state = State::resharded;
  std::optional<Pending> gathering;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;  // hold the grad hooks
  int64_t expected = 0;  // parameters that get gradients
  int64_t arrived = 0;   // of them, those whose gradient arrived in this backward
  bool reduced = false;  // the reduce-scatter of this backward started
  std::optional<Pending> reducing;
  torch::Tensor reduced_grad;  // reduce_dtype [shard_numel]
};

FullyShardedDataParallel::FullyShardedDataParallel(
    torch::nn::Module& model, std::vector<NamedParams> units,
    const std::function<bool(const std::string&)>& decay, Group* group, torch::Device device,
    const FsdpOptions& options)
    : group_(group), options_(options) {
  world_ = group ? group->world_size() : 1;
  rank_ = group ? group->rank() : 0;
  size_t count = 0;
  for (const auto& unit : units) count += unit.size();
  if (count == 0) throw std::runtime_error("FSDP: the model has no parameters");
  device_ = device;
  if (group && world_ > 1) {
    // Rank 0's buffers everywhere (its weights follow unit by unit), as DDP starts.
    std::vector<torch::Tensor> buffers;
    for (const auto& b : model.buffers(/*recurse=*/true)) buffers.push_back(b);
    torch::NoGradGuard no_grad;
    group->broadcast(buffers, /*root=*/0);
  }
  for (size_t i = 0; i < units.size(); ++i) {
    NamedParams trainable, frozen;  // a unit's frozen parameters in a flat buffer of their own
    for (auto& named : units[i]) {
      (named.second.requires_grad() ? trainable : frozen).push_back(std::move(named));
    }
    units_.push_back(build_unit(i, std::move(trainable), decay, /*frozen=*/false));
    frozen_.push_back(frozen.empty() ? nullptr : build_unit(i, std::move(frozen), decay, true));
  }
  for (size_t i = 0; i < units_.size(); ++i) register_grad_hooks(i);
  options_.fill = nullptr;  // the shards are filled: what it holds (open files, a tensor) goes
}

FullyShardedDataParallel::~FullyShardedDataParallel() = default;

std::unique_ptr<FullyShardedDataParallel::Unit> FullyShardedDataParallel::build_unit(
    size_t index, NamedParams params, const std::function<bool(const std::string&)>& decay,
    bool frozen) {
  auto u = std::make_unique<Unit>();
  u->frozen = frozen;
  // Frozen parameters keep their dtype (a LoRA base in bfloat16) in the shard and when gathered,
  // unless float32: gathered in param_dtype as the others.
  c10::ScalarType dtype =
      frozen && !params.empty() ? params.front().second.scalar_type() : torch::kFloat;
  for (auto& [name, p] : params) {
    u->slots.push_back(Slot{name, p, p.sizes().vec(), 0, p.numel(), !frozen && decay(name)});
    if (p.scalar_type() != dtype) dtype = torch::kFloat;
  }
  const c10::ScalarType gathered = dtype == torch::kFloat ? options_.param_dtype : dtype;
  std::stable_sort(u->slots.begin(), u->slots.end(),
                   [](const Slot& a, const Slot& b) { return a.decay && !b.decay; });
  int64_t decay_numel = 0;
  for (auto& s : u->slots) {
    s.offset = u->numel;
    u->numel += s.numel;
    if (s.decay) decay_numel += s.numel;
    if (s.param.requires_grad()) ++u->expected;
  }
  u->padded = round_up(std::max<int64_t>(u->numel, 1), world_);
  u->shard_numel = u->padded / world_;
  const auto on = torch::TensorOptions().device(device_);
  torch::NoGradGuard no_grad;
  if (options_.fill) {
    u->shard = filled_shard(*u, dtype);  // [S]
  } else {
    auto flat = torch::zeros({u->padded}, on.dtype(torch::kFloat));  // [padded]
    for (const auto& s : u->slots) {
      flat.narrow(0, s.offset, s.numel).copy_(s.param.detach().reshape({-1}));
    }
    if (group_ && world_ > 1) group_->broadcast({flat}, /*root=*/0);  // rank 0's weights
    u->shard = flat.narrow(0, rank_ * u->shard_numel, u->shard_numel).to(dtype, false, true);
  }
  u->full = torch::empty({u->padded}, on.dtype(gathered));
  for (auto& s : u->slots) s.param.set_data(u->full.narrow(0, s.offset, s.numel).view(s.shape));
  free_storage(u->full);
  if (frozen) return u;
  // The optimizer's views: this rank's part of the decay range, then of the no-decay range.
  const int64_t begin = rank_ * u->shard_numel, end = begin + u->shard_numel;
  const std::pair<int64_t, int64_t> ranges[] = {{0, decay_numel}, {decay_numel, u->numel}};
  for (int k = 0; k < 2; ++k) {
    const int64_t a = std::max(begin, ranges[k].first), b = std::min(end, ranges[k].second);
    if (a >= b) continue;
    views_.push_back(ShardView{"fsdp." + std::to_string(index) + (k == 0 ? ".decay" : ".no_decay"),
                               u->shard.narrow(0, a - begin, b - a), k == 0, index, a});
  }
  return u;
}

torch::Tensor FullyShardedDataParallel::filled_shard(const Unit& u, c10::ScalarType dtype) const {
  auto shard = torch::zeros({u.shard_numel}, torch::TensorOptions().device(device_).dtype(dtype));
  const int64_t begin = rank_ * u.shard_numel, end = begin + u.shard_numel;
  for (const auto& s : u.slots) {
    const int64_t a = std::max(begin, s.offset), b = std::min(end, s.offset + s.numel);
    if (a < b) options_.fill(s.name, a - s.offset, shard.narrow(0, a - begin, b - a));
  }
  return shard;  // [S]: the padding zero, as the broadcast flat buffer's
}

void FullyShardedDataParallel::register_grad_hooks(size_t index) {
  Unit& u = *units_[index];
  for (auto& s : u.slots) {
    if (!s.param.requires_grad()) continue;
    auto acc = torch::autograd::impl::grad_accumulator(s.param);
    acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, index](const torch::autograd::variable_list& outputs,
                      const torch::autograd::variable_list& /*inputs*/) {
          on_gradient(index);
          return outputs;
        }));
    u.accumulators.push_back(std::move(acc));
  }
}

void FullyShardedDataParallel::start_gather(size_t index) {
  start_gather(*units_[index]);
  if (frozen_[index]) start_gather(*frozen_[index]);
}

void FullyShardedDataParallel::start_gather(Unit& u) {
  if (u.state != Unit::State::resharded) return;
  allocate_storage(u.full, u.padded * static_cast<int64_t>(u.full.element_size()));
  torch::NoGradGuard no_grad;
  const torch::Tensor input = u.shard.to(u.full.scalar_type());  // [S]
  if (world_ == 1) {
    u.full.copy_(input);
    u.state = Unit::State::gathered;
    return;
  }
  u.gathering = group_->all_gather_into_async(u.full, input);
  u.state = Unit::State::gathering;
}

void FullyShardedDataParallel::wait_gather(size_t index) {
  start_gather(index);
  wait_gather(*units_[index]);
  if (frozen_[index]) wait_gather(*frozen_[index]);
}

void FullyShardedDataParallel::wait_gather(Unit& u) {
  if (u.state != Unit::State::gathering) return;
  u.gathering->wait();
  u.gathering.reset();
  u.state = Unit::State::gathered;
}

void FullyShardedDataParallel::reshard(size_t index) {
  if (index == 0 && root_held_) return;
  for (Unit* u : {units_[index].get(), frozen_[index].get()}) {
    if (u) reshard(*u);
  }
}

void FullyShardedDataParallel::reshard(Unit& u) {
  if (u.state == Unit::State::resharded) return;
  if (u.state == Unit::State::gathering) wait_gather(u);
  free_storage(u.full);
  u.state = Unit::State::resharded;
}

void FullyShardedDataParallel::before_forward(bool /*first*/, bool sync) {
  sync_ = sync;
  for (auto& u : units_) {
    u->arrived = 0;
    u->reduced = false;
  }
  wait_gather(0);
  if (options_.prefetch && units_.size() > 1) start_gather(1);
}

void FullyShardedDataParallel::after_forward(const torch::Tensor& loss, bool /*sync*/) {
  if (!options_.reshard_after_forward || !loss.requires_grad()) return;
  reshard(0);
  // Gathered again when backward begins, the last block right behind it.
  const_cast<torch::Tensor&>(loss).register_hook([this](const torch::Tensor& /*grad*/) {
    wait_gather(0);
    if (options_.prefetch && units_.size() > 1) start_gather(units_.size() - 1);
  });
}

void FullyShardedDataParallel::before_block(int64_t index) {
  const auto unit = static_cast<size_t>(index) + 1;
  wait_gather(unit);
  if (options_.prefetch && unit + 1 < units_.size()) start_gather(unit + 1);
}

void FullyShardedDataParallel::after_block(int64_t index, const torch::Tensor& output) {
  const auto unit = static_cast<size_t>(index) + 1;
  const bool training = torch::GradMode::is_enabled() && output.requires_grad();
  if (training) {
    const_cast<torch::Tensor&>(output).register_hook([this, unit](const torch::Tensor& /*grad*/) {
      wait_gather(unit);
      if (options_.prefetch && unit > 1) start_gather(unit - 1);
      // The gradient reached the next block's input: its backward, which reads its frozen
      // parameters to the end, is done.
      if (unit + 1 < frozen_.size() && frozen_[unit + 1]) reshard(*frozen_[unit + 1]);
    });
  }
  if (!training || options_.reshard_after_forward) reshard(unit);
}

void FullyShardedDataParallel::on_gradient(size_t index) {
  Unit& u = *units_[index];
  if (++u.arrived < u.expected) return;
  if (sync_) start_reduce(index);
  // Its frozen parameters may still be read by the rest of its backward (the gradient of its
  // input): they are released when that reaches the block before, or after the backward.
  if (index != 0 || !root_held_) reshard(u);
}

void FullyShardedDataParallel::start_reduce(size_t index) {
  Unit& u = *units_[index];
  if (u.reduced) return;
  u.reduced = true;
  torch::NoGradGuard no_grad;
  const auto on = torch::TensorOptions().device(device_).dtype(options_.reduce_dtype);
  auto flat = torch::empty({u.padded}, on);  // [padded]
  std::vector<torch::Tensor> grads;  // each flattened by _chunk_cat: one operator for the unit
  for (const auto& s : u.slots) {
    const torch::Tensor& g = s.param.grad();
    grads.push_back(g.defined() ? g : torch::zeros(s.shape, s.param.options()));
  }
  if (u.numel > 0) {
    torch::Tensor head = flat.narrow(0, 0, u.numel).view({1, u.numel});  // [1, numel]
    if (grads.front().scalar_type() == options_.reduce_dtype) {
      at::_chunk_cat_out(head, grads, /*dim=*/0, /*num_chunks=*/1);
    } else {
      head.copy_(at::_chunk_cat(grads, /*dim=*/0, /*num_chunks=*/1));
    }
  }
  if (u.padded > u.numel) flat.narrow(0, u.numel, u.padded - u.numel).zero_();
  for (auto& s : u.slots) s.param.mutable_grad().reset();
  // Averaged as DDP does: each rank's share divided before the sum.
  if (world_ > 1) flat.div_(world_);
  if (world_ == 1) {
    u.reduced_grad = flat;
    return;
  }
  u.reduced_grad = torch::empty({u.shard_numel}, on);
  u.reducing = group_->reduce_scatter_async(u.reduced_grad, flat);
}

void FullyShardedDataParallel::finish_reduce(size_t index) {
  Unit& u = *units_[index];
  if (u.reducing) {
    u.reducing->wait();
    u.reducing.reset();
  }
}

void FullyShardedDataParallel::after_backward() {
  for (size_t i = units_.size(); i-- > 0;) start_reduce(i);  // units not finished: unused params
  for (size_t i = 0; i < units_.size(); ++i) finish_reduce(i);
  for (auto& v : views_) {
    Unit& u = *units_[v.unit];
    const int64_t begin = rank_ * u.shard_numel;
    torch::Tensor grad = u.reduced_grad.narrow(0, v.flat_offset - begin, v.tensor.numel());
    v.tensor.mutable_grad() = grad.to(torch::kFloat);
  }
  for (size_t i = 0; i < units_.size(); ++i) {
    units_[i]->reduced_grad = torch::Tensor();
    reshard(i);
  }
}

torch::Tensor FullyShardedDataParallel::reduce_over_shards(const torch::Tensor& value, Reduce op) {
  torch::Tensor out =
      value.defined() ? value : torch::zeros({}, torch::dtype(torch::kFloat).device(device_));
  if (group_ && world_ > 1) group_->all_reduce({out}, op);
  return out;
}

void FullyShardedDataParallel::gather_root() {
  wait_gather(0);
  root_held_ = true;
}

void FullyShardedDataParallel::release_root() {
  root_held_ = false;
  reshard(0);
}

std::vector<Piece> FullyShardedDataParallel::parameter_pieces() const {
  std::vector<Piece> out;
  for (size_t v = 0; v < views_.size(); ++v) {
    for (auto& piece : view_pieces(v, views_[v].tensor, "")) out.push_back(std::move(piece));
  }
  return out;
}

std::vector<Piece> FullyShardedDataParallel::view_pieces(size_t view, const torch::Tensor& field,
                                                         const std::string& suffix) const {
  const ShardView& v = views_.at(view);
  const Unit& u = *units_[v.unit];
  const int64_t a = v.flat_offset, b = a + v.tensor.numel();
  std::vector<Piece> out;
  for (const auto& s : u.slots) {
    const int64_t lo = std::max(a, s.offset), hi = std::min(b, s.offset + s.numel);
    if (lo >= hi) continue;
    const std::string name = suffix.empty() ? s.name : s.name + "." + suffix;
    if (field.dim() == 0) {
      out.push_back(Piece{name, {}, 0, field.reshape({1})});
    } else {
      out.push_back(
          Piece{name, s.shape, lo - s.offset, field.reshape({-1}).narrow(0, lo - a, hi - lo)});
    }
  }
  return out;
}

std::vector<std::string> FullyShardedDataParallel::view_parameters(size_t view) const {
  std::vector<std::string> out;
  for (const auto& piece : view_pieces(view, views_.at(view).tensor, "")) {
    out.push_back(piece.name);
  }
  return out;
}

std::string FullyShardedDataParallel::load_parameters(
    const std::function<torch::Tensor(const std::string&)>& full) const {
  std::string problems;
  for (const auto& u : units_) {
    for (const auto& s : u->slots) {
      const torch::Tensor t = full(s.name);
      if (!t.defined()) {
        problems += (problems.empty() ? "" : ", ") + std::string("missing ") + s.name;
      } else if (t.sizes().vec() != s.shape) {
        problems += (problems.empty() ? "" : ", ") + s.name + " of another shape";
      }
    }
  }
  if (!problems.empty()) return problems;
  torch::NoGradGuard no_grad;
  for (size_t v = 0; v < views_.size(); ++v) {
    views_[v].tensor.copy_(view_from_full(v, full));
  }
  return "";
}

torch::Tensor FullyShardedDataParallel::view_from_full(
    size_t view, const std::function<torch::Tensor(const std::string&)>& full) const {
  const ShardView& v = views_.at(view);
  const Unit& u = *units_[v.unit];
  const int64_t a = v.flat_offset, b = a + v.tensor.numel();
  std::vector<torch::Tensor> parts;
  for (const auto& s : u.slots) {
    const int64_t lo = std::max(a, s.offset), hi = std::min(b, s.offset + s.numel);
    if (lo >= hi) continue;
    const torch::Tensor t = full(s.name);
    if (!t.defined() || t.numel() != s.numel) return torch::Tensor();
    parts.push_back(t.reshape({-1}).narrow(0, lo - s.offset, hi - lo).to(device_, torch::kFloat));
  }
  return torch::cat(parts);
}

int64_t FullyShardedDataParallel::padded_parameter_bytes() const {
  int64_t bytes = 0;
  for (const auto* all : {&units_, &frozen_}) {
    for (const auto& u : *all) {
      if (u) bytes += u->padded * static_cast<int64_t>(u->full.element_size());
    }
  }
  return bytes;
}

}  // namespace trainer::distributed
