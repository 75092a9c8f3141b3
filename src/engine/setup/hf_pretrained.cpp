#include "engine/setup/hf_pretrained.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/hf_folder.h"
#include "nn/quant/nf4.h"
#include "util/format.h"
#include "util/log.h"

namespace trainer::engine {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(const config::LoadedConfig& loaded, const std::string& message) {
  throw config::ConfigError(
      {config::Issue{loaded.where("model.pretrained"), "model.pretrained", message}});
}

// The model that reads config.json's model_type, and its name.
std::pair<std::string, const models::ForeignFormat*> reader_of(const std::string& type,
                                                               std::string& readers) {
  const auto& registry = models::model_registry();
  for (const auto& name : registry.names()) {
    const auto& hf = registry.get(name).hf;
    if (!hf || hf->model_types.empty()) continue;
    std::string types;
    for (const auto& t : hf->model_types) {
      if (t == type) return {name, &*hf};
      types += (types.empty() ? "" : ", ") + t;
    }
    readers += (readers.empty() ? "" : "; ") + types + " (model " + name + ")";
  }
  return {"", nullptr};
}

// Whether the config's text of a value (config::flatten's) is `want`.
bool same_value(const std::string& ours, const nlohmann::json& want) {
  if (want.is_boolean()) return ours == (want.get<bool>() ? "true" : "false");
  if (want.is_string()) return ours == want.get<std::string>();
  try {
    const double a = std::stod(ours), b = want.get<double>();
    return a == b || std::abs(a - b) <= 1e-9 * std::max(std::abs(a), std::abs(b));
  } catch (const std::exception&) {
    return false;
  }
}

void set_option(config::Entries& options, const std::string& key, const nlohmann::json& v) {
  if (v.is_boolean()) {
    options.set(key, v.get<bool>());
  } else if (v.is_number_integer()) {
    options.set(key, v.get<int64_t>());
  } else if (v.is_number()) {
    options.set(key, v.get<double>());
  } else {
    options.set(key, v.get<std::string>());
  }
}

// model.name: config.json's reader, unless the config names another model.
const models::ForeignFormat& pick_model(config::LoadedConfig& loaded, const std::string& file,
                                        const nlohmann::json& json) {
  auto& m = loaded.cfg.model;
  if (!json.contains("model_type") || !json["model_type"].is_string()) {
    fail(loaded, file +
                     " has no model_type; a Hugging Face model folder's config.json names "
                     "its architecture there");
  }
  const std::string type = json["model_type"].get<std::string>();
  std::string readers;
  const auto [name, hf] = reader_of(type, readers);
  if (!hf) {
    fail(loaded, file + ": model_type \"" + type +
                     "\" is not read from a folder (model types read: " + readers +
                     "); a model whose layout the trainer reads from a file (gpt: GPT-2) loads "
                     "with model.pretrained: " +
                     m.pretrained + "/model.safetensors");
  }
  if (!loaded.origins.count("model.name")) {
    m.name = name;
    loaded.origins["model.name"] = config::Location{file, 0, 0};
  } else if (m.name != name) {
    throw config::ConfigError({config::Issue{
        loaded.where("model.name"), "model.name",
        "model.name is " + m.name + ", but " + file + "'s model_type \"" + type + "\" is model " +
            name + "'s; set model.name: " + name + " or leave it out"}});
  }
  return *hf;
}

// "a, b, c" (at most 6 names, then "and N more").
std::string listed(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < 6; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > 6) out += " and " + std::to_string(names.size() - 6) + " more";
  return out;
}

std::string shape_text(c10::IntArrayRef shape) {
  std::ostringstream os;
  os << shape;
  return os.str();
}

bool floating(c10::ScalarType t) {
  return t == torch::kFloat || t == torch::kBFloat16 || t == torch::kHalf || t == torch::kDouble;
}

// What loading copies where: a model tensor for each file tensor that fills it, and the file
// tensors holding a tied tensor's other names, compared with it once it is loaded.
struct LoadPlan {
  std::map<std::string, torch::Tensor> into;                    // file tensor -> model tensor
  std::vector<std::pair<std::string, std::string>> tied_again;  // (file tensor, the one loaded)
  std::vector<std::string> kept;                                // model tensors left as they are
  std::set<std::string> saved_quantized;  // weights the files hold in bitsandbytes' 4-bit form
};

// The tensor beside a weight P.weight that bitsandbytes' 4-bit form saves (nn/quant/nf4.h).
const std::string kNf4State = ".quant_state.bitsandbytes__nf4";

// The file tensors the model lacks: HF's stored rotary tables are recomputed, not weights.
std::vector<std::string> unexpected(const checkpoint::HfWeights& w,
                                    const std::set<std::string>& own) {
  std::vector<std::string> out;
  const std::string rotary = "rotary_emb.inv_freq";
  for (const auto& [name, where] : w.tensors) {
    const bool stored_rotary =
        name.size() >= rotary.size() &&
        name.compare(name.size() - rotary.size(), rotary.size(), rotary) == 0;
    if (!own.count(name) && !stored_rotary) {
      out.push_back(name + " (in " + w.files[where.file].path() + ")");
    }
  }
  return out;
}

// Whether file tensor `e` (in `file`) can fill model tensor `name`, `t`: its shape and kind of
// dtype; otherwise a problem, or (`in_head`, model.pretrained_skip_head) the tensor kept as built.
bool fits(const std::string& name, const torch::Tensor& t, const checkpoint::SafetensorsEntry& e,
          const std::string& file, bool in_head, LoadPlan& plan,
          std::vector<std::string>& problems) {
  if (c10::IntArrayRef(e.shape) != t.sizes()) {
    if (in_head) {
      plan.kept.push_back(name);
    } else {
      problems.push_back(file + ": tensor " + name + " is " + shape_text(e.shape) +
                         ", the model's " + shape_text(t.sizes()));
    }
    return false;
  }
  if (floating(t.scalar_type()) != floating(e.dtype)) {
    problems.push_back(file + ": tensor " + name + " is " + c10::toString(e.dtype) +
                       ", the model's " + c10::toString(t.scalar_type()) +
                       " (weights are bf16, f16 or f32)");
    return false;
  }
  return true;
}

// `quantized_ok` (model.lora.base_quant: nf4): a weight the files hold in bitsandbytes' 4-bit form
// (P.weight with P.weight.quant_state.bitsandbytes__nf4 beside it) is read as such, not compared.
LoadPlan plan_load(const models::NetImpl& model, const checkpoint::HfWeights& w, bool skip_head,
                   bool quantized_ok, std::vector<std::string>& problems) {
  std::set<const void*> params;
  for (const auto& p : model.parameters(/*recurse=*/true)) params.insert(p.unsafeGetTensorImpl());
  const std::string head = skip_head ? models::head_prefix(model) : "";
  const auto in_head = [&](const std::string& n) { return !head.empty() && n.rfind(head, 0) == 0; };
  LoadPlan plan;
  std::map<const void*, std::string> filled;  // model tensor -> the file tensor filling it
  std::vector<std::pair<std::string, torch::Tensor>> absent;
  std::vector<std::string> missing;
  std::set<std::string> own;
  for (const auto& [name, t] : models::state_dict(model)) {
    own.insert(name);
    const auto it = w.tensors.find(name);
    if (it == w.tensors.end()) {
      absent.emplace_back(name, t);
      continue;
    }
    if (quantized_ok && w.tensors.count(name + kNf4State)) {
      plan.saved_quantized.insert(name);
      for (const auto& suffix : nn::quant::nf4_saved_suffixes()) own.insert(name + suffix);
      continue;
    }
    if (!fits(name, t, *it->second.entry, w.files[it->second.file].path(), in_head(name), plan,
              problems)) {
      continue;
    }
    const auto [first, fresh] = filled.emplace(t.unsafeGetTensorImpl(), name);
    if (fresh) {
      plan.into[name] = t;
    } else {
      plan.tied_again.emplace_back(name, first->second);
    }
  }
  for (const auto& [name, t] : absent) {
    if (filled.count(t.unsafeGetTensorImpl())) continue;  // tied to a tensor the files hold
    if (!params.count(t.unsafeGetTensorImpl()) || in_head(name)) {
      plan.kept.push_back(name);
    } else {
      missing.push_back(name);
    }
  }
  if (!missing.empty()) {
    problems.push_back(std::to_string(missing.size()) +
                       " of the model's tensors in no file: " + listed(missing));
  }
  const auto extra = unexpected(w, own);
  if (!extra.empty()) {
    problems.push_back(std::to_string(extra.size()) + " tensors the model lacks: " + listed(extra));
  }
  return plan;
}

// The names of a tied tensor in the files hold equal values, compared as the model holds them (in
// its dtype): each name the plan loads again against the one the model is filled from, whose value
// is the model's tensor once it is `filled` (copy_planned), else read from its file.
void check_tied_in_files(const checkpoint::HfWeights& w, const LoadPlan& plan,
                         const config::LoadedConfig& loaded, bool filled) {
  const std::string& untie_hint = models::model_registry().get(loaded.cfg.model.name).untie_hint;
  for (const auto& [name, loaded_as] : plan.tied_again) {
    const auto& where = w.tensors.at(name);
    const auto& t = plan.into.at(loaded_as);
    const auto value = w.files[where.file].read(*where.entry).to(t.scalar_type());
    const auto& first = w.tensors.at(loaded_as);
    if (!torch::equal(value,
                      filled ? t : w.files[first.file].read(*first.entry).to(t.scalar_type()))) {
      fail(loaded, w.files[where.file].path() + ": " + name + " and " + loaded_as +
                       " differ, but they are one tensor in the model (tied)" +
                       (untie_hint.empty() ? "" : "; " + untie_hint));
    }
  }
}

// Copies the planned tensors file by file, in each file's order, then checks that the names of
// one tied tensor were given equal values.
void copy_planned(const checkpoint::HfWeights& w, const LoadPlan& plan,
                  const config::LoadedConfig& loaded) {
  for (const auto& f : w.files) {
    for (const auto& e : f.entries()) {
      const auto it = plan.into.find(e.name);
      if (it != plan.into.end()) f.read_into(e, it->second);
    }
  }
  check_tied_in_files(w, plan, loaded, /*filled=*/true);
}

// Folder model.pretrained opened and checked against the model: ConfigError before anything is
// read when it does not fit.
LoadPlan checked_plan(const models::NetImpl& model, const config::LoadedConfig& loaded,
                      checkpoint::HfWeights& weights) {
  const auto& m = loaded.cfg.model;
  try {
    weights = checkpoint::open_hf_weights(m.pretrained);
  } catch (const checkpoint::FormatError& e) {
    fail(loaded, e.what());
  }
  std::vector<std::string> problems;
  auto plan =
      plan_load(model, weights, m.pretrained_skip_head, m.lora.base_quant == "nf4", problems);
  if (!problems.empty()) {
    std::string all;
    for (const auto& p : problems) all += (all.empty() ? "" : "; ") + p;
    fail(loaded, m.pretrained + " does not fit model " + m.name + ": " + all);
  }
  return plan;
}

void log_loaded(const config::LoadedConfig& loaded, const checkpoint::HfWeights& weights,
                const LoadPlan& plan, const char* how) {
  log::info(strprintf("initialised from %s: %zu tensors in %zu files (%.1f MB: %s)%s%s%s",
                      loaded.cfg.model.pretrained.c_str(), weights.tensors.size(),
                      weights.files.size(), static_cast<double>(weights.bytes) / 1e6,
                      checkpoint::hf_files_read(weights).c_str(), how,
                      plan.kept.empty() ? "" : "; kept as built: ", listed(plan.kept).c_str()));
}

// The reader of the weights `weights` hold in bitsandbytes' 4-bit form, by parameter name.
SavedQuantizedRead saved_quantized_reader(std::shared_ptr<checkpoint::HfWeights> weights,
                                          std::set<std::string> names) {
  return [weights, names = std::move(names)](const std::string& name) {
    nn::quant::Nf4SavedTensors out;
    if (!names.count(name)) return out;
    std::vector<torch::Tensor*> fields = {&out.weight,           &out.absmax,
                                          &out.quant_map,        &out.nested_absmax,
                                          &out.nested_quant_map, &out.quant_state};
    const auto& suffixes = nn::quant::nf4_saved_suffixes();
    for (size_t i = 0; i < suffixes.size(); ++i) {
      const auto it = weights->tensors.find(name + suffixes[i]);
      if (it != weights->tensors.end()) {
        *fields[i] = weights->files[it->second.file].read(*it->second.entry);
      }
    }
    return out;
  };
}

}  // namespace

void load_hf_folder(models::NetImpl& model, const config::LoadedConfig& loaded) {
  checkpoint::HfWeights weights;
  const auto plan = checked_plan(model, loaded, weights);
  if (!plan.saved_quantized.empty()) {
    fail(loaded, loaded.cfg.model.pretrained + " holds " + *plan.saved_quantized.begin() +
                     " quantized (bitsandbytes 4-bit), which is read only for a model built from "
                     "the folder alone; leave model.pretrained_skip_head out");
  }
  torch::NoGradGuard no_grad;
  copy_planned(weights, plan, loaded);
  log_loaded(loaded, weights, plan, "");
}

void check_hf_folder(const models::NetImpl& model, const config::LoadedConfig& loaded) {
  checkpoint::HfWeights weights;
  const auto plan = checked_plan(model, loaded, weights);
  log_loaded(loaded, weights, plan, "; headers checked, nothing read (a planned model)");
}

ParameterFill hf_folder_fill(const models::NetImpl& model, const config::LoadedConfig& loaded,
                             SavedQuantizedRead* saved_quantized) {
  auto weights = std::make_shared<checkpoint::HfWeights>();
  const auto plan = checked_plan(model, loaded, *weights);
  if (!plan.saved_quantized.empty() && !saved_quantized) {
    fail(loaded, loaded.cfg.model.pretrained + " holds " + *plan.saved_quantized.begin() +
                     " quantized (bitsandbytes 4-bit), which is read in one process or under "
                     "ddp only");
  }
  if (saved_quantized) *saved_quantized = saved_quantized_reader(weights, plan.saved_quantized);
  torch::NoGradGuard no_grad;
  check_tied_in_files(*weights, plan, loaded, /*filled=*/false);
  std::map<const void*, std::string> file_name;  // model tensor -> the file tensor filling it
  for (const auto& [name, t] : plan.into) file_name[t.unsafeGetTensorImpl()] = name;
  std::map<std::string, checkpoint::HfWeights::Where> source;  // every name of a model tensor
  for (const auto& [name, t] : models::state_dict(model)) {
    const auto it = file_name.find(t.unsafeGetTensorImpl());
    if (it != file_name.end()) source[name] = weights->tensors.at(it->second);
  }
  for (const auto& [name, p] : models::unique_named_parameters(model)) {
    if (!source.count(name) && !plan.saved_quantized.count(name)) {
      throw std::logic_error("hf_folder_fill: parameter " + name + " is in no file of " +
                             loaded.cfg.model.pretrained + " (model.pretrained_skip_head?)");
    }
  }
  log_loaded(loaded, *weights, plan, ", each process reading the part it keeps");
  // Converting reads go through buffers of 8 MB: what a rank holds beyond its parts stays small.
  constexpr size_t kChunk = size_t{8} << 20;
  return [weights, source](const std::string& name, int64_t first, const torch::Tensor& dst) {
    const auto& where = source.at(name);
    const auto& file = weights->files[where.file];
    if (dst.device().is_cpu()) return file.read_range_into(*where.entry, first, dst, kChunk);
    auto host = torch::empty({dst.numel()}, dst.options().device(torch::kCPU));  // [n]
    file.read_range_into(*where.entry, first, host, kChunk);
    dst.copy_(host);
  };
}

namespace {

// Where a tensor-parallel part's elements lie in the whole tensor, both flattened: the part is
// runs of `run` elements, its run i at element i x stride + offset of the whole.
struct PartRuns {
  int64_t run = 0, stride = 0, offset = 0;
};

// The runs of `part`, split by `split` over `parts` ranks, of rank `rank`: the part is
// [outer, groups x each, inner] of the whole [outer, groups x each x parts, inner], a run for
// each outer index and group.
PartRuns part_runs(const torch::Tensor& part, const TensorSplit& split, int rank, int parts) {
  const int64_t each = part.size(split.dim) / split.groups;
  int64_t inner = 1;
  for (int64_t d = split.dim + 1; d < part.dim(); ++d) inner *= part.size(d);
  return {each * inner, each * parts * inner, rank * each * inner};
}

}  // namespace

ParameterFill part_fill(ParameterFill fill, const models::NetImpl& model, const nn::SplitPlan& plan,
                        int rank, int parts) {
  std::map<const void*, PartRuns> split_tensors;  // a tied tensor under any of its names
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    const auto it = plan.find(item.key());
    if (it == plan.end()) continue;
    split_tensors[item.value().unsafeGetTensorImpl()] =
        part_runs(item.value(), it->second, rank, parts);
  }
  auto runs = std::make_shared<std::map<std::string, PartRuns>>();
  for (const auto& [name, t] : models::state_dict(model)) {
    const auto it = split_tensors.find(t.unsafeGetTensorImpl());
    if (it != split_tensors.end()) (*runs)[name] = it->second;
  }
  return [fill = std::move(fill), runs](const std::string& name, int64_t first,
                                        const torch::Tensor& dst) {
    const auto it = runs->find(name);
    if (it == runs->end()) return fill(name, first, dst);  // whole on every rank
    const PartRuns& r = it->second;
    for (int64_t done = 0, n = dst.numel(); done < n;) {
      const int64_t at = first + done, in_run = at % r.run;
      const int64_t take = std::min(r.run - in_run, n - done);
      fill(name, at / r.run * r.stride + r.offset + in_run, dst.narrow(0, done, take));
      done += take;
    }
  };
}

void fill_split_parameters(models::NetImpl& model, const ParameterFill& fill,
                           const nn::SplitPlan& plan, int rank, int parts) {
  torch::NoGradGuard no_grad;
  const auto fill_part = part_fill(fill, model, plan, rank, parts);
  for (auto& [name, p] : models::unique_named_parameters(model)) {
    fill_part(name, 0, p.view({-1}));  // the part, contiguous (keep_parts)
  }
}

// config.json's sizes against the weights' headers (read, not the tensors): a model far larger
// than the files hold is refused before it is built (and memory runs out building it), and so is
// a folder whose weights do not open (none there, a damaged index or header).
void check_weights_size(const config::LoadedConfig& loaded, const models::ForeignFormat& hf,
                        const nlohmann::json& options, const std::string& file) {
  const auto& m = loaded.cfg.model;
  checkpoint::HfWeights weights;
  try {
    weights = checkpoint::open_hf_weights(m.pretrained);
  } catch (const checkpoint::FormatError& e) {
    fail(loaded, e.what());  // before a model of config.json's sizes is built
  }
  if (!hf.parameter_count) return;
  double elements = 0;
  for (const auto& [name, where] : weights.tensors) {
    double n = 1;
    for (const int64_t size : where.entry->shape) n *= static_cast<double>(size);
    elements += n;
  }
  const double want = hf.parameter_count(options);
  if (want <= 2 * elements + (1 << 20)) return;
  std::string sizes;
  for (auto it = options.begin(); it != options.end(); ++it) {
    if (it->is_number_integer()) sizes += (sizes.empty() ? "" : ", ") + it.key() + " " + it->dump();
  }
  fail(loaded, strprintf("%s makes a model of %.3g parameters, but the weights in %s hold %.3g: "
                         "its sizes (%s) are not the weights'; copy config.json again from the "
                         "model's source",
                         file.c_str(), want, m.pretrained.c_str(), elements, sizes.c_str()));
}

namespace {

// A folder bitsandbytes quantized (config.json's quantization_config, which the model's reader
// accepted: 4-bit NF4) is a QLoRA base: model.lora.base_quant becomes nf4 (recorded as set by
// config.json); without model.lora, or with another base_quant, a ConfigError.
void apply_quantization_config(config::LoadedConfig& loaded, const nlohmann::json& json,
                               const std::string& file) {
  if (!json.contains("quantization_config") || json["quantization_config"].is_null()) return;
  auto& lora = loaded.cfg.model.lora;
  if (!lora.enabled()) {
    fail(loaded, file +
                     " quantizes the model's linear layers (bitsandbytes 4-bit NF4): such a base "
                     "stays frozen under LoRA adapters (QLoRA); set model.lora.rank (8 to 64)");
  }
  const std::string key = "model.lora.base_quant";
  if (lora.base_quant != "nf4" && loaded.origins.count(key)) {
    throw config::ConfigError({config::Issue{
        loaded.where(key), key,
        key + " is " + lora.base_quant + ", but " + file +
            " holds NF4 weights (bitsandbytes 4-bit); leave it out or set it to nf4"}});
  }
  lora.base_quant = "nf4";
  loaded.origins[key] = config::Location{file, 0, 0};
}

}  // namespace

void apply_hf_folder_config(config::LoadedConfig& loaded) {
  auto& m = loaded.cfg.model;
  if (!checkpoint::is_directory(m.pretrained)) return;
  const std::string file = (fs::path(m.pretrained) / "config.json").string();
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) {
    fail(loaded, m.pretrained +
                     " is a folder without config.json; give a Hugging Face model "
                     "folder (config.json and model.safetensors or its shards) or a "
                     "safetensors file");
  }
  nlohmann::json json;
  try {
    json = checkpoint::read_json_object(file);
  } catch (const checkpoint::FormatError& e) {
    fail(loaded, e.what());
  }
  const auto& hf = pick_model(loaded, file, json);
  std::vector<std::string> errors, warnings;
  const auto options = hf.options_of_config(json, errors, warnings);
  for (const auto& w : warnings) log::warn(file + ": " + w);
  std::vector<config::Issue> issues;
  for (const auto& e : errors) {
    issues.push_back({loaded.where("model.pretrained"), "model.pretrained",
                      file + ": " + e + "; model " + m.name + " would compute another model"});
  }
  for (auto it = options.begin(); it != options.end(); ++it) {
    const std::string key = "model." + it.key();
    const auto ours = config::lookup(loaded.cfg, key);
    if (loaded.origins.count(key) && ours && !same_value(*ours, *it)) {
      issues.push_back({loaded.where(key), key,
                        key + " is " + *ours + ", but " + file + " makes it " + it->dump() +
                            "; leave " + key + " out (the folder sets it) or use another folder"});
      continue;
    }
    set_option(m.options, it.key(), *it);
    loaded.origins[key] = config::Location{file, 0, 0};
  }
  if (!issues.empty()) throw config::ConfigError(issues);
  apply_quantization_config(loaded, json, file);
  check_weights_size(loaded, hf, options, file);
}

}  // namespace trainer::engine
