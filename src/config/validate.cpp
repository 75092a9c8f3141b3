// validate() and check(): each section's and registered entry's own range checks, then the checks
// across sections or about the machine (device, CUDA graphs, registered names).

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "config/loader.h"
#include "config/loader_internal.h"
#include "util/format.h"
#include "util/strings.h"

namespace trainer::config {
namespace detail {
namespace {

// Runs each section's validate() and each of its entries' under the section's key prefix.
struct SectionChecker {
  Checks checks;

  template <class T>
  void operator()(const char* name, T& field) {
    if constexpr (is_entries_v<T>) {
      for (const auto& [entry, options] : field.all()) options->validate(checks);
    } else if constexpr (is_section_v<T>) {
      Checks own = checks.section(std::string(name) + ".");
      field.validate(own);
      SectionChecker inner{own};
      field.visit(inner);
    } else if constexpr (is_section_list_v<T>) {
      for (size_t i = 0; i < field.items.size(); ++i) {
        Checks own = checks.section(item_prefix(name, i));
        field.items[i].validate(own);
        SectionChecker inner{own};
        field.items[i].visit(inner);
      }
    }
  }
};

// "cuda:N" -> N; nullopt when not of that form.
std::optional<int64_t> cuda_index(const std::string& device) {
  if (device.rfind("cuda:", 0) != 0) return std::nullopt;
  std::string n = device.substr(5);
  if (n.empty() || n[0] == '+' || n[0] == '-') return std::nullopt;
  return parse_int(n);
}

// The checks about the machine and across sections.
void check_environment(const Config& c, const Environment& env, Checks& checks) {
  const std::string& d = c.device;
  const bool known = d == "auto" || d == "cpu" || d == "cuda" || cuda_index(d).has_value();
  if (!known) {
    checks.add("device", "must be auto, cpu, cuda or cuda:N, got '" + d + "'");
  } else if ((d == "cuda" || cuda_index(d)) && !env.cuda_available) {
    checks.add("device", "no CUDA device is available; use device: cpu or auto (got '" + d + "')");
  } else if (auto n = cuda_index(d); n && *n >= env.cuda_devices) {
    checks.add("device", "device " + d + " does not exist; " + std::to_string(env.cuda_devices) +
                             " CUDA device(s) available, use cuda:0.." +
                             std::to_string(env.cuda_devices - 1));
  }
  const bool cpu_only = c.device == "cpu" || (c.device == "auto" && !env.cuda_available);
  if (c.amp.enabled && c.amp.dtype == "float16" && cpu_only) {
    checks.add("amp.dtype",
               "float16 autocast needs a CUDA device; use amp.dtype: bfloat16 or a cuda device");
  }
  if (c.dist.backend == "nccl" && (!env.cuda_available || c.device == "cpu")) {
    checks.add("dist.backend", "nccl needs CUDA devices; use dist.backend: gloo or auto");
  }
  // optim.lr 0 (frozen weights) decays nowhere: min_lr 0 is fine then.
  if ((c.sched.name == "cosine" || c.sched.name == "linear") && c.sched.min_lr >= 0.0 &&
      !(c.sched.min_lr < c.optim.lr) && !(c.optim.lr == 0.0 && c.sched.min_lr == 0.0)) {
    checks.add("sched.min_lr", "must be < optim.lr (" + format_number(c.optim.lr) + ") for the " +
                                   c.sched.name + " schedule, got " +
                                   format_number(c.sched.min_lr));
  }
}

// Whether the run trains on the CPU: asked to, or left to choose where there is no CUDA device.
bool trains_on_cpu(const Config& c, const Environment& env) {
  return c.device == "cpu" || (c.device == "auto" && !env.cuda_available);
}

// train.cuda_graph: what a captured step cannot do.
void check_cuda_graph(const Config& c, const Environment& env, Checks& checks) {
  if (!c.train.cuda_graph) return;
  const auto fail = [&](const std::string& why) { checks.add("train.cuda_graph", why); };
  if (trains_on_cpu(c, env)) {
    fail("needs a CUDA device (device: cuda); set train.cuda_graph: false");
  }
  if (c.optim.impl == "foreach" || c.optim.impl == "loop") {
    fail(
        "needs optim.impl fused (a captured step reads the learning rate and the skip decision "
        "on the device; " +
        c.optim.impl + " computes them on the host)");
  }
  if (c.model.checkpointing != "none") {
    fail(
        "cannot capture model.checkpointing (its recomputation sets the RNG state from the host); "
        "set model.checkpointing: none");
  }
  if (!c.data.drop_last) {
    fail("needs batches of one shape; set data.drop_last: true");
  }
  if (c.dist.strategy == "fsdp") {
    fail(
        "cannot capture fsdp's gathers and frees; set dist.strategy: ddp or train.cuda_graph: "
        "false");
  }
  if (c.dist.find_unused_parameters || c.dist.reducer_at_world_size_1) {
    fail(
        "cannot capture DDP's reducer; set dist.find_unused_parameters and "
        "dist.reducer_at_world_size_1 to false");
  }
  if (c.train.rollback_on_nan) {
    fail(
        "cannot follow train.rollback_on_nan (reloading the optimizer's state replaces tensors "
        "the captured step writes); set one of them false");
  }
}

// dist.tp_size: what the tensor-parallel step does not do (its divisibility by the ranks and the
// model's sizes is checked when they are known: the job's world size, the built model).
void check_tensor_parallel(const Config& c, Checks& checks) {
  if (c.dist.tp_size <= 1) return;
  const std::string tp = "dist.tp_size " + std::to_string(c.dist.tp_size);
  if (c.train.label_smoothing > 0.0) {
    checks.add("train.label_smoothing",
               "the vocabulary-parallel cross-entropy of " + tp +
                   " has no label smoothing; set train.label_smoothing: 0 or dist.tp_size: 1");
  }
  if (c.train.cuda_graph) {
    checks.add("train.cuda_graph", "cannot capture the tensor-parallel collectives of " + tp +
                                       "; set train.cuda_graph: false or dist.tp_size: 1");
  }
}

// Settings that only a CUDA device has.
void check_cuda_only(const Config& c, const Environment& env, Checks& checks) {
  if (trains_on_cpu(c, env) && c.profile.memory_snapshot) {
    checks.add("profile.memory_snapshot",
               "records the CUDA caching allocator's history, and this run trains on the CPU" +
                   std::string(env.cuda_available ? "" : " (no CUDA device here)") +
                   "; set it false, or profile.memory: true for the CPU's allocations in the "
                   "trace");
  }
}

// Registry-keyed values ("model.name", ...) that name nothing registered.
void check_names(const Config& c, const Environment& env, Checks& checks) {
  for (const auto& [key, names] : env.choices) {
    const auto found = lookup(c, key);
    if (!found) continue;
    const std::string& value = *found;
    if (std::find(names.begin(), names.end(), value) != names.end()) continue;
    std::string msg = "unknown " + key + " '" + value + "'; registered: " + join(names, ", ");
    const std::string s = closest(value, names);
    if (!s.empty()) msg += " (did you mean " + s + "?)";
    checks.add(key, msg);
  }
}

// train.objective dpo and data.name preference go together: the data set's rows are pairs of
// completions, which only the preference objective reads as such.
void check_objective(const Config& c, Checks& checks) {
  checks.one_of("train.objective", c.train.objective, {"supervised", "dpo"});
  const bool dpo = c.train.objective == "dpo", pairs = c.data.name == "preference";
  if (dpo && !pairs) {
    checks.add("train.objective",
               "dpo trains on pairs of completions; set data.name: "
               "preference or train.objective: supervised (data.name is " +
                   c.data.name + ")");
  } else if (pairs && !dpo) {
    checks.add("data.name",
               "preference holds pairs of completions for train.objective: dpo; set "
               "train.objective: dpo or another data set (train.objective is " +
                   c.train.objective + ")");
  }
  if (dpo && c.train.cuda_graph) {
    checks.add("train.cuda_graph",
               "does not capture the preference step (rows of a batch's own "
               "length); set train.cuda_graph: false");
  }
  if (dpo && c.dist.tp_size > 1) {
    checks.add("dist.tp_size",
               "dpo's log-probabilities take the whole vocabulary, which tensor parallelism "
               "splits; set dist.tp_size: 1 (ddp or fsdp)");
  }
  // A full fine-tune's reference is a frozen copy of the whole model, which fsdp does not shard
  // (simpo and orpo compare with none).
  const bool reference = c.dpo.loss_type != "simpo" && c.dpo.loss_type != "orpo";
  if (dpo && c.dist.strategy == "fsdp" && c.model.lora.rank <= 0 && reference) {
    checks.add("dist.strategy",
               "fsdp does not shard the frozen copy of the whole model that a full fine-tune's "
               "dpo compares with; set model.lora (the reference is then the base), "
               "dist.strategy: ddp, or dpo.loss_type simpo or orpo");
  }
}

// model.lora.base_quant holds each quantizable layer's whole weight in one process: not split
// over fsdp shards or tensor-parallel parts.
void check_quantized_base(const Config& c, Checks& checks) {
  if (c.model.lora.base_quant == "none") return;
  if (c.dist.strategy == "fsdp" || c.dist.tp_size > 1) {
    checks.add("model.lora.base_quant",
               c.model.lora.base_quant +
                   " holds each layer's whole quantized weight on every rank, which fsdp and "
                   "tensor parallelism do not split yet: it trains alone or under ddp; set "
                   "dist.strategy: ddp and dist.tp_size: 1, or base_quant: none");
  }
}

}  // namespace
}  // namespace detail

void DpoConfig::validate(Checks& c) const {
  c.one_of("loss_type", loss_type, {"sigmoid", "ipo", "hinge", "robust", "simpo", "orpo"});
  if (!(beta > 0.0)) c.add("beta", "must be > 0, got " + format_number(beta));
  if (!(label_smoothing >= 0.0 && label_smoothing < 0.5)) {
    c.add("label_smoothing", "must be in [0, 0.5), got " + format_number(label_smoothing));
  }
  if (!(cpo_alpha >= 0.0)) c.add("cpo_alpha", "must be >= 0, got " + format_number(cpo_alpha));
}

std::vector<Issue> validate(const LoadedConfig& loaded, const Environment& env) {
  std::vector<Issue> issues;
  Checks top(
      "", [&](const std::string& key) { return loaded.where(key); }, issues);
  Config c = loaded.cfg;
  detail::SectionChecker sections{top};
  c.visit(sections);
  detail::check_environment(c, env, top);
  detail::check_cuda_graph(c, env, top);
  detail::check_tensor_parallel(c, top);
  detail::check_cuda_only(c, env, top);
  detail::check_names(c, env, top);
  detail::check_objective(c, top);
  detail::check_quantized_base(c, top);
  return detail::without_repeats(std::move(issues));
}

void check(const LoadedConfig& loaded, const Environment& env) {
  auto issues = validate(loaded, env);
  if (!issues.empty()) throw ConfigError(std::move(issues));
}

}  // namespace trainer::config
