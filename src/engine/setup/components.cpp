#include "engine/setup/components.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "checkpoint/hf_folder.h"
#include "checkpoint/safetensors.h"
#include "engine/setup/adapter_state.h"
#include "engine/setup/hf_pretrained.h"
#include "engine/setup/quantized_base.h"
#include "engine/setup/seeded_shards.h"
#include "nn/batch_norm.h"
#include "nn/deferred_init.h"
#include "nn/lora.h"
#include "nn/parameters.h"
#include "util/format.h"
#include "util/log.h"

namespace trainer::engine {
namespace {

[[noreturn]] void config_error(const config::LoadedConfig& loaded, const std::string& key,
                               const std::string& message) {
  throw config::ConfigError({config::Issue{loaded.where(key), key, message}});
}

// Seeds and determinism switches; before anything draws random numbers or touches cuBLAS.
void seed_everything(const config::Config& cfg) {
  torch::manual_seed(static_cast<uint64_t>(cfg.seed));
  auto& ctx = at::globalContext();
  // Before any thread is started: new threads (the intra-op pool, loader threads) inherit this
  // thread's floating-point mode.
  ctx.setFlushDenormal(cfg.run.flush_denormal);
  // Fixes this thread's intra-op thread count now, before loader threads set theirs to one.
  torch::set_num_threads(cfg.run.threads > 0 ? static_cast<int>(cfg.run.threads)
                                             : torch::get_num_threads());
  if (cfg.deterministic) {
    setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
    ctx.setDeterministicAlgorithms(true, /*warn_only=*/false);
    ctx.setDeterministicCuDNN(true);
    ctx.setBenchmarkCuDNN(false);
  } else {
    ctx.setBenchmarkCuDNN(true);
  }
}

// A launched job's ranks on a node take one GPU each: cuda:LOCAL_RANK.
torch::Device pick_device(const std::string& name, const distributed::DistEnv& job) {
  const std::string gpu = "cuda:" + std::to_string(job.launched() ? job.local_rank : 0);
  if (name == "auto") return torch::cuda::is_available() ? torch::Device(gpu) : torch::kCPU;
  return torch::Device(name == "cuda" ? gpu : name);
}

std::unique_ptr<distributed::Group> make_group(const config::Config& cfg,
                                               const distributed::DistEnv& job,
                                               torch::Device device) {
  if (!job.launched()) return nullptr;
  distributed::GroupOptions group;
  group.backend =
      cfg.dist.backend != "auto" ? cfg.dist.backend : (device.is_cuda() ? "nccl" : "gloo");
  group.device = device;
  group.init_timeout_s = cfg.dist.init_timeout_s;
  group.timeout_s = cfg.dist.timeout_s;
  return std::make_unique<distributed::Group>(job, group);
}

// dist.tp_size: the tensor-parallel group of this rank's tp_size consecutive ranks and the
// data-parallel group of the ranks holding the same parts. Alone (no launched job) the model
// stays whole.
void make_tensor_parallel(Components& c, const config::LoadedConfig& loaded) {
  const int tp = static_cast<int>(loaded.cfg.dist.tp_size);
  if (tp <= 1) return;
  if (!c.group) {
    log::warn(
        strprintf("dist.tp_size %d: one process, the model stays whole; launch a multiple "
                  "of %d processes to split it (trainer launch --nproc-per-node %d)",
                  tp, tp, tp));
    return;
  }
  const int world = c.group->world_size(), rank = c.group->rank();
  if (world % tp != 0) {
    config_error(loaded, "dist.tp_size",
                 strprintf("dist.tp_size %d does not divide the job's %d processes; use a "
                           "tp_size that divides the world size (data-parallel size = world "
                           "size / tp_size)",
                           tp, world));
  }
  std::vector<int> tp_ranks, dp_ranks;
  for (int r = rank / tp * tp; r < rank / tp * tp + tp; ++r) tp_ranks.push_back(r);
  for (int r = rank % tp; r < world; r += tp) dp_ranks.push_back(r);
  c.tp_group =
      std::make_unique<distributed::Group>(*c.group, tp_ranks, "tp" + std::to_string(rank / tp));
  c.dp_group =
      std::make_unique<distributed::Group>(*c.group, dp_ranks, "dp" + std::to_string(rank % tp));
  c.tp = std::make_shared<distributed::GroupTensorParallel>(*c.tp_group);
}

// This rank's loaders over the splits: the ranks of a tensor-parallel group read the same
// batches.
void make_loaders(Components& c, const config::Config& cfg, const distributed::DistEnv& job) {
  data::LoaderOptions train;
  train.batch_size = cfg.data.batch_size;
  train.shuffle = cfg.data.shuffle;
  train.drop_last = cfg.data.drop_last;
  train.workers = cfg.data.workers;
  train.prefetch = cfg.data.prefetch;
  train.throttle_ms = cfg.data.throttle_ms;
  train.seed = static_cast<uint64_t>(cfg.seed);
  train.pin_memory = c.device.is_cuda();
  const distributed::Group* data = c.data_group();
  train.rank = data ? data->rank() : job.rank;
  train.world_size = data ? data->world_size() : 1;
  data::LoaderOptions val = train;
  val.batch_size = cfg.data.eval_batch_size > 0 ? cfg.data.eval_batch_size : cfg.data.batch_size;
  val.shuffle = false;
  val.drop_last = false;
  val.even = false;  // each validation sample counted once over the ranks
  c.train_loader = std::make_unique<data::Loader>(c.splits.train, train);
  c.val_loader = std::make_unique<data::Loader>(c.splits.val, val);
}

// The splits, this rank's loaders and the run's length in steps.
void make_data(Components& c, const config::LoadedConfig& loaded, const distributed::DistEnv& job) {
  const auto& cfg = loaded.cfg;
  // A chat run's data.chat_date as rank 0 resolved it (cli/train.cpp), on every rank.
  config::DataConfig data = cfg.data;
  if (c.group && cfg.data.name == "chat") {
    data.options.set(
        "chat_date",
        c.group->broadcast_text(cfg.data.options.value<std::string>("chat_date"), /*root=*/0));
  }
  try {
    c.splits = data::dataset_registry().get(cfg.data.name)(data, data_context(cfg));
  } catch (const data::DataConfigError& e) {
    config_error(loaded, e.key(), e.message());
  }
  make_loaders(c, cfg, job);
  c.steps_per_epoch = c.train_loader->batches_per_epoch() / cfg.train.grad_accum_steps;
  if (c.steps_per_epoch == 0) {
    config_error(loaded, "data.batch_size",
                 "data.batch_size " + std::to_string(cfg.data.batch_size) +
                     " x train.grad_accum_steps " + std::to_string(cfg.train.grad_accum_steps) +
                     " leaves no full step in the " + std::to_string(c.splits.train->size()) +
                     " training samples; use a smaller batch");
  }
  c.total_steps =
      cfg.train.max_steps > 0 ? cfg.train.max_steps : cfg.train.epochs * c.steps_per_epoch;
}

// A foreign layout's config file beside model.pretrained (Hugging Face's config.json) against the
// model: a setting that would make the model compute something else is a config error; one that
// only training uses, a warning.
void check_foreign_config(const models::ModelKind& kind, const models::NamedWeights& weights,
                          const config::LoadedConfig& loaded) {
  const auto& m = loaded.cfg.model;
  if (!kind.hf || !kind.hf->check_config || !kind.hf->matches(weights)) return;
  const auto file = std::filesystem::path(m.pretrained).parent_path() / "config.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) return;
  nlohmann::json json;
  try {
    json = checkpoint::read_json_object(file.string());
  } catch (const checkpoint::FormatError& e) {
    config_error(loaded, "model.pretrained", e.what());
  }
  std::map<std::string, std::string> flat;
  for (const auto& [key, value] : config::flatten(loaded.cfg)) flat[key] = value;
  std::vector<std::string> errors, warnings;
  kind.hf->check_config(json, flat, errors, warnings);
  for (const auto& w : warnings) log::warn(file.string() + ": " + w);
  if (!errors.empty()) {
    std::string all;
    for (const auto& e : errors) all += (all.empty() ? "" : "; ") + e;
    config_error(loaded, "model.pretrained",
                 file.string() + " beside " + m.pretrained + " describes another model: " + all +
                     "; use weights of a model " + m.name + " computes, or a config that matches");
  }
}

// " (Hugging Face GPT-2's layout, converted)" where the file is in the model's foreign layout.
std::string kinds_note(const models::ModelKind& kind, const models::NamedWeights& weights) {
  return kind.hf && kind.hf->matches(weights) ? " (" + kind.hf->name + "'s layout, converted)" : "";
}

// Copies model.pretrained's weights into the model.
void load_pretrained(Components& c, const config::LoadedConfig& loaded) {
  const auto& m = loaded.cfg.model;
  if (checkpoint::is_directory(m.pretrained)) {
    if (c.build == Build::plan) return check_hf_folder(*c.model, loaded);
    return load_hf_folder(*c.model, loaded);
  }
  checkpoint::SafetensorsFile weights;
  try {
    weights = checkpoint::read_safetensors(m.pretrained);
  } catch (const checkpoint::FormatError& e) {
    config_error(loaded, "model.pretrained", e.what());
  }
  const auto& kind = models::model_registry().get(m.name);
  check_foreign_config(kind, weights.tensors, loaded);
  // Hugging Face's layout of the model, where it has one, is converted first.
  const auto converted = models::to_trainer_layout(m.name, weights.tensors);
  std::vector<std::string> reinitialised;
  const std::string problems = models::load_weights(*c.model, converted, m.pretrained_skip_head,
                                                    kind.untie_hint, &reinitialised);
  if (!problems.empty()) {
    // The hint where the classifier is what does not fit.
    const std::string head = models::head_prefix(*c.model);
    const bool head_differs = !head.empty() && problems.find(head) != std::string::npos;
    config_error(loaded, "model.pretrained",
                 m.pretrained + " does not fit model " + m.name + ": " + problems +
                     (m.pretrained_skip_head || !head_differs
                          ? ""
                          : " (model.pretrained_skip_head: true re-initialises the classifier)"));
  }
  std::string kept;
  for (const auto& n : reinitialised) kept += (kept.empty() ? "" : ", ") + n;
  log::info(strprintf(
      "initialised from %s: %zu tensors%s%s", m.pretrained.c_str(), converted.size(),
      kinds_note(kind, weights.tensors).c_str(),
      kept.empty() ? "" : ("; re-initialised (model.pretrained_skip_head): " + kept).c_str()));
}

// Whether folder model.pretrained gives every parameter of the model (the adapters of model.lora
// aside, which are drawn): then the model is built without writing its parameters
// (nn/deferred_init.h) and each is written once, from the files.
bool files_give_every_parameter(const config::Config& cfg) {
  return checkpoint::is_directory(cfg.model.pretrained) && !cfg.model.pretrained_skip_head;
}

// Whether the parameters stream from folder model.pretrained straight into what this rank keeps,
// its FSDP shards, (dist.tp_size) its parts, or both: its FSDP shards of its parts, so that no rank
// ever holds the whole model.
bool streams_into_parts(const Components& c, const config::Config& cfg) {
  return (cfg.dist.strategy == "fsdp" || c.tp != nullptr) && files_give_every_parameter(cfg);
}

// model.lora's frozen base, not written yet, reallocated in its final dtype (still unwritten): read
// from the files straight into it, it never exists in float32.
void unwritten_in(models::NetImpl& model, c10::ScalarType dtype) {
  torch::NoGradGuard no_grad;
  for (auto& p : model.parameters(/*recurse=*/true)) {
    if (p.is_floating_point() && p.scalar_type() != dtype) {
      p.set_data(torch::empty(p.sizes(), p.options().dtype(dtype)));
    }
  }
}

// c.model built under `deferral` (nn/deferred_init.h); a planned one wholly on the meta device.
void build_net(Components& c, const config::LoadedConfig& loaded, nn::Deferral deferral) {
  try {
    nn::DeferredInit deferred(deferral);
    c.model = models::build_model(loaded.cfg.model, c.input);
    // What the model built with storage (norms, buffers; a model that ignores the setting).
    if (deferral == nn::Deferral::shapes_only) nn::move_to_meta(*c.model);
  } catch (const models::ModelError& e) {
    config_error(loaded, e.key(), e.what());
  }
}

// c.input: what the model is built for, from the data's spec and model.num_classes.
void set_input(Components& c, const config::LoadedConfig& loaded) {
  const auto& cfg = loaded.cfg;
  const auto& spec = c.splits.spec;
  c.input = models::InputSpec{spec.sample_shape,
                              cfg.model.num_classes > 0 ? cfg.model.num_classes : spec.num_classes};
  if (c.input.num_classes < spec.num_classes) {
    config_error(loaded, "model.num_classes",
                 "the dataset has " + std::to_string(spec.num_classes) +
                     " classes, more than model.num_classes " +
                     std::to_string(c.input.num_classes) + "; use 0 to take the dataset's count");
  }
}

// model.pretrained's weights into c.model: `stream`: nothing read, the reader of the files
// returned (streams_into_parts); `quantizing`: read parameter by parameter, each quantizable
// layer's weight quantized as it is read (model.lora.base_quant); else loaded whole.
ParameterFill read_weights(Components& c, const config::LoadedConfig& loaded, bool stream,
                           bool quantizing) {
  if (stream) return hf_folder_fill(*c.model, loaded);
  if (quantizing) {
    SavedQuantizedRead saved;  // weights the folder holds quantized already
    auto fill = hf_folder_fill(*c.model, loaded, &saved);
    fill_quantized(*c.model, fill, saved, loaded);
  } else if (!loaded.cfg.model.pretrained.empty()) {
    load_pretrained(c, loaded);
  }
  return nullptr;
}

// Under tp, the model split over the tensor-parallel group: this rank keeps its parts. With `fill`
// (streamed from the files) the parts are left unwritten and read from the files: here, or under
// fsdp, `fill` becomes the reader of the parts that make_fsdp fills its shards from.
void split_model(Components& c, const config::LoadedConfig& loaded, ParameterFill& fill) {
  {
    nn::DeferredInit unwritten(fill ? nn::Deferral::unwritten : nn::deferral());
    try {
      c.tp_plan = c.model->split_over(c.tp);
      split_adapters(c);  // model.lora: each adapter as its layer splits
    } catch (const models::ModelError& e) {
      config_error(loaded, e.key(), e.what());
    }
  }
  if (!fill) return;
  if (loaded.cfg.dist.strategy == "fsdp") {
    fill = part_fill(std::move(fill), *c.model, c.tp_plan, c.tp->rank(), c.tp->size());
  } else {
    fill_split_parameters(*c.model, fill, c.tp_plan, c.tp->rank(), c.tp->size());
    fill = nullptr;
  }
}

// The model, its weights loaded (under tp, this rank's parts); where they stream into the FSDP
// shards (streams_into_parts), the reader make_fsdp fills them from instead.
ParameterFill make_model(Components& c, const config::LoadedConfig& loaded) {
  const auto& cfg = loaded.cfg;
  const auto& spec = c.splits.spec;
  set_input(c, loaded);
  const bool plan = c.build == Build::plan;
  const bool stream = !plan && streams_into_parts(c, cfg);
  const bool lora = cfg.model.lora.enabled();
  const bool unwritten = stream || (!plan && lora && files_give_every_parameter(cfg));
  // A model drawn from the seed under fsdp: each rank draws its shards again (seeded_shards.h).
  std::optional<nn::InitReplay> replay;
  if (!plan && cfg.dist.strategy == "fsdp" && cfg.model.pretrained.empty() && !lora) {
    replay.emplace();
  }
  build_net(c, loaded,
            plan        ? nn::Deferral::shapes_only
            : unwritten ? nn::Deferral::unwritten
                        : nn::Deferral::none);
  nn::RecordedDraws draws = replay ? replay->take() : nn::RecordedDraws{};
  replay.reset();
  if (unwritten && lora) unwritten_in(*c.model, nn::lora_base_dtype(cfg.model.lora.base_dtype));
  if (spec.packed && !c.model->takes_positions()) {
    config_error(loaded, "data.pack",
                 "model " + cfg.model.name +
                     " cannot keep attention inside packed conversations; set data.pack: false");
  }
  // model.lora.base_quant: a base read from the files is quantized layer by layer as it is read;
  // one built otherwise once it is cast to its dtype.
  const bool quantized = lora && !plan && cfg.model.lora.base_quant != "none";
  ParameterFill fill = read_weights(c, loaded, stream, quantized && unwritten);
  if (!draws.empty()) fill = replayed_fill(*c.model, std::move(draws));
  if (lora) {
    add_seeded_lora(c, loaded);  // the base frozen, adapters attached
    if (fill) fill = with_adapters(std::move(fill), *c.model);
  }
  if (quantized && !unwritten) quantize_base(*c.model, loaded);
  if (c.tp) split_model(c, loaded, fill);
  if (plan) {
    // The planned model stays on the meta device.
  } else if (cfg.dist.strategy != "fsdp") {
    c.model->to(c.device);
  } else {
    // fsdp moves the parameters to the device a shard at a time (make_fsdp): the whole model
    // never occupies it.
    torch::NoGradGuard no_grad;
    for (auto& b : c.model->buffers(/*recurse=*/true)) b.set_data(b.to(c.device));
  }
  c.params.clear();
  for (auto& p : models::unique_parameters(*c.model)) {
    if (p.requires_grad()) c.params.push_back(p);
  }
  return fill;
}

// The model's parameters by unit: the root's (those in no block), then each block's.
std::vector<distributed::NamedParams> sharding_units(const models::NetImpl& model) {
  const auto blocks = model.blocks();
  std::map<const void*, size_t> unit_of;  // parameter -> its block's unit
  for (size_t i = 0; i < blocks.size(); ++i) {
    for (const auto& p : blocks[i]->parameters(/*recurse=*/true)) {
      unit_of.emplace(p.unsafeGetTensorImpl(), i + 1);
    }
  }
  std::vector<distributed::NamedParams> units(blocks.size() + 1);
  for (auto& [name, p] : models::unique_named_parameters(model)) {
    const auto it = unit_of.find(p.unsafeGetTensorImpl());
    units[it == unit_of.end() ? 0 : it->second].emplace_back(name, p);
  }
  return units;
}

// dist.strategy fsdp: the parameters sharded over the group (or kept whole alone), the model's
// blocks gathered one at a time. `fill`, when set, gives the shards' values (streams_into_parts).
void make_fsdp(Components& c, const config::Config& cfg, ParameterFill fill) {
  const auto& d = cfg.dist;
  distributed::FsdpOptions o;
  o.reshard_after_forward = d.reshard_after_forward;
  o.param_dtype = dtype_named(d.fsdp_param_dtype != "auto" ? d.fsdp_param_dtype
                              : cfg.amp.enabled            ? cfg.amp.dtype
                                                           : "float32");
  o.reduce_dtype = dtype_named(d.fsdp_reduce_dtype);
  o.prefetch = d.fsdp_prefetch;
  o.fill = std::move(fill);
  std::set<std::string> decay;
  for (const auto& named : optim::split_parameters(*c.model, cfg.optim).decay) {
    decay.insert(named.first);
  }
  c.fsdp = std::make_unique<distributed::FullyShardedDataParallel>(
      *c.model, sharding_units(*c.model),
      [&decay](const std::string& name) { return decay.count(name) > 0; }, c.data_group(), c.device,
      o);
  c.model->set_block_hooks(c.fsdp.get());
  c.params.clear();
  for (const auto& v : c.fsdp->views()) c.params.push_back(v.tensor);
}

// DDP or FSDP, and synchronised batch norm over the group.
void make_parallel(Components& c, const config::LoadedConfig& loaded, ParameterFill fill) {
  if (loaded.cfg.dist.strategy == "fsdp") make_fsdp(c, loaded.cfg, std::move(fill));
  if (!c.group) return;
  const auto& d = loaded.cfg.dist;
  distributed::DdpOptions ddp;
  ddp.bucket_cap_mb = d.bucket_cap_mb;
  ddp.first_bucket_mb = d.first_bucket_mb;
  ddp.find_unused_parameters = d.find_unused_parameters;
  ddp.broadcast_buffers = d.broadcast_buffers;
  ddp.reducer_at_world_size_1 = d.reducer_at_world_size_1;
  if (!c.fsdp) {
    c.ddp = std::make_unique<distributed::DataParallel>(
        *c.model, models::unique_named_parameters(*c.model), *c.data_group(), ddp);
  }
  if (!d.sync_bn) return;
  distributed::Group* group = c.data_group();  // outlives the model (declared before it)
  nn::BatchNormSync sync{group->rank(), group->world_size(), {}};
  // Alone, the global batch is this process's: plain batch norm (no sum).
  if (group->world_size() > 1) {
    sync.sum = [group](torch::Tensor& t) { group->all_reduce({t}, distributed::Reduce::sum); };
  }
  if (nn::sync_batch_norm(*c.model, sync) == 0) {
    config_error(loaded, "dist.sync_bn",
                 "model " + loaded.cfg.model.name +
                     " has no batch norm to synchronise; remove "
                     "dist.sync_bn");
  }
}

// The mean cross-entropy of vocabulary-parallel logits [..., K / tp] (this rank's classes)
// against targets [...] in the whole vocabulary, over the targets kept (not kIgnoreIndex; 0 when
// none is), as the registry's cross_entropy takes it; the logits are never gathered.
losses::Loss vocabulary_parallel_loss(std::shared_ptr<distributed::GroupTensorParallel> tp) {
  return [tp](const torch::Tensor& logits, const torch::Tensor& targets) {
    const int64_t k = logits.size(-1);
    const auto t = targets.reshape({-1});  // [N]
    const auto token_losses = distributed::vocab_parallel_cross_entropy(
        logits.reshape({-1, k}).to(torch::kFloat), t, tp->rank() * k, tp->group());  // [N]
    // The sum over their count, at least 1: no host read.
    return token_losses.sum() / t.ne(losses::kIgnoreIndex).sum().clamp_min(1).to(torch::kFloat);
  };
}

// Optimizer, schedule, loss and mixed precision.
void make_training(Components& c, const config::Config& cfg) {
  if (c.fsdp) {
    optim::ParamGroups shards;
    for (const auto& v : c.fsdp->views()) {
      (v.decay ? shards.decay : shards.no_decay).emplace_back(v.name, v.tensor);
    }
    c.optimizer = optim::make_optimizer(std::move(shards), cfg.optim);
  } else {
    c.optimizer = optim::make_optimizer(*c.model, cfg.optim);
  }
  config::SchedConfig sched = cfg.sched;
  if (sched.warmup_epochs > 0.0) {
    sched.warmup_steps = std::llround(sched.warmup_epochs * static_cast<double>(c.steps_per_epoch));
  }
  c.schedule = std::make_unique<optim::Schedule>(sched, cfg.optim.lr, c.total_steps);
  c.loss = c.tp ? vocabulary_parallel_loss(c.tp)
                : losses::loss_registry().get(cfg.train.loss)(cfg.train);
  if (!c.tp) c.output_loss = losses::output_loss(cfg.train);
  c.precision.autocast = cfg.amp.enabled;
  c.precision.dtype = dtype_named(cfg.amp.dtype);
  const bool float16 = cfg.amp.enabled && cfg.amp.dtype == "float16";
  if (cfg.amp.scaler == "on" || (cfg.amp.scaler == "auto" && float16)) {
    optim::GradScalerOptions scaler;
    scaler.init_scale = cfg.amp.init_scale;
    scaler.growth_factor = cfg.amp.growth_factor;
    scaler.backoff_factor = cfg.amp.backoff_factor;
    scaler.growth_interval = cfg.amp.growth_interval;
    c.scaler = std::make_unique<optim::GradScaler>(scaler, c.device);
  }
}

}  // namespace

void relabel(Components& c, const config::Config& cfg, const distributed::DistEnv& job,
             const std::vector<int64_t>& to_model) {
  c.splits.train = data::with_labels(c.splits.train, to_model);
  c.splits.val = data::with_labels(c.splits.val, to_model);
  make_loaders(c, cfg, job);
}

c10::ScalarType dtype_named(const std::string& name) {
  return name == "bfloat16" ? c10::kBFloat16 : name == "float16" ? c10::kHalf : c10::kFloat;
}

torch::Tensor Components::whole_outputs(const torch::Tensor& outputs) const {
  return tp ? distributed::join_over(outputs, {outputs.dim() - 1, 1}, *tp_group) : outputs;
}

int Components::world_size() const {
  return group ? group->world_size() : 1;
}

Components build_components(const config::LoadedConfig& loaded, const distributed::DistEnv& job,
                            Build build) {
  const auto& cfg = loaded.cfg;
  seed_everything(cfg);
  Components c;
  c.build = build;
  c.device = pick_device(cfg.device, job);
  if (c.device.is_cuda()) c10::impl::getDeviceGuardImpl(torch::kCUDA)->setDevice(c.device);
  c.group = make_group(cfg, job, c.device);
  make_tensor_parallel(c, loaded);
  make_data(c, loaded, job);  // before the model: its input and output sizes come from the data
  auto fill = make_model(c, loaded);
  if (build == Build::train) make_parallel(c, loaded, std::move(fill));
  make_training(c, cfg);
  return c;
}

data::DataContext data_context(const config::Config& cfg) {
  const auto& kind = models::model_registry().get(cfg.model.name);
  return {cfg.seed, kind.context_length ? kind.context_length(cfg.model) : 0, cfg.model.pretrained};
}

config::Config config_defaults() {
  config::Config cfg;
  cfg.model.options = models::model_registry().options();
  cfg.data.options = data::dataset_registry().options();
  cfg.data.mix.prototype.options = cfg.data.options;
  cfg.optim.options = optim::optimizer_registry().options();
  return cfg;
}

config::LoadedConfig load_config(const std::string& path,
                                 const std::vector<std::string>& overrides) {
  auto loaded = config::load(path, overrides, config_defaults());
  apply_hf_folder_config(loaded);  // model.pretrained: DIR sets the model's keys
  return loaded;
}

config::Environment config_environment() {
  config::Environment env;
  env.cuda_available = torch::cuda::is_available();
  env.cuda_devices = static_cast<int64_t>(torch::cuda::device_count());
  env.choices["model.name"] = models::model_registry().names();
  env.choices["data.name"] = data::dataset_registry().names();
  env.choices["optim.name"] = optim::optimizer_registry().names();
  env.choices["sched.name"] = optim::schedule_registry().names();
  env.choices["train.loss"] = losses::loss_registry().names();
  return env;
}

std::string warmup_warning(const config::Config& cfg, const Components& c) {
  const auto& sched = cfg.sched;
  const int64_t warmup = c.schedule->warmup_steps();
  if (warmup <= c.total_steps) return "";
  // The run ends while the rate still rises: it never reaches optim.lr.
  const double reached = sched.warmup_start_factor + (1.0 - sched.warmup_start_factor) *
                                                         static_cast<double>(c.total_steps) /
                                                         static_cast<double>(warmup);
  return strprintf("the warm-up (%" PRId64 " steps) is longer than the run (%" PRId64
                   " steps): the learning rate ends at %.0f%% of optim.lr; shorten "
                   "sched.warmup_steps / sched.warmup_epochs or train longer",
                   warmup, c.total_steps, 100.0 * reached);
}

}  // namespace trainer::engine
