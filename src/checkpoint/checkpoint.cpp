#include "checkpoint/checkpoint.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <set>

#include "checkpoint/shared_tensors.h"
#include "util/fileio.h"
#include "util/format.h"
#include "util/json_error.h"
#include "util/log.h"
#include "util/tensor_split.h"

namespace trainer::checkpoint {
namespace {

constexpr const char* kManifest = "manifest.json";
constexpr const char* kMetaKey = "trainer";
constexpr int kFormat = 1;

std::string hex64(uint64_t v) {
  return strprintf("%016llx", static_cast<unsigned long long>(v));
}

std::string file_name(int64_t step) {
  return strprintf("step_%08" PRId64 ".safetensors", step);
}

bool lower_is_better(const std::string& metric) {
  return metric == "loss" || metric == "ppl";
}

std::string dir_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string base_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// A manifest entry's metrics: numbers only (a metric that is not one is left out).
std::map<std::string, double> read_metrics(const nlohmann::json& j) {
  std::map<std::string, double> out;
  if (!j.is_object()) return out;
  for (const auto& [name, value] : j.items()) {
    if (value.is_number()) out[name] = value.get<double>();
  }
  return out;
}

// The manifest's entries, oldest first; nullopt when there is none or it cannot be read (with a
// warning naming it, given to `warn`).
std::optional<std::vector<Entry>> read_manifest(
    const std::string& dir, const std::function<void(const std::string&)>& warn =
                                [](const std::string& m) { log::warn(m); }) {
  const std::string path = dir + "/" + kManifest;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  std::vector<Entry> out;
  try {
    const auto bytes = read_bytes(path);
    const auto j = nlohmann::json::parse(bytes.begin(), bytes.end());
    for (const auto& e : j.at("checkpoints")) {
      Entry entry;
      entry.file = e.at("file").get<std::string>();
      entry.step = e.at("step").get<int64_t>();
      entry.bytes = e.at("bytes").get<uint64_t>();
      entry.xxh64 = e.at("xxh64").get<std::string>();
      if (e.contains("metrics")) entry.metrics = read_metrics(e["metrics"]);
      out.push_back(std::move(entry));
    }
  } catch (const std::exception& e) {
    warn(path + ": unreadable manifest (" + e.what() +
         "); using the checkpoint files beside it instead");
    return std::nullopt;
  }
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) { return a.step < b.step; });
  return out;
}

std::string shards_dir(const std::string& dir, int64_t step) {
  return dir + "/" + strprintf("step_%08" PRId64 ".shards", step);
}

// Removes a checkpoint's shard directory, if any.
void remove_shards(const std::string& dir, int64_t step) {
  const std::string shards = shards_dir(dir, step);
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(shards.c_str()), &::closedir);
  if (!d) return;
  while (const dirent* e = ::readdir(d.get())) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") ::unlink((shards + "/" + name).c_str());
  }
  ::rmdir(shards.c_str());
}

// The bytes of `path` after checking their size and checksum; CorruptCheckpoint otherwise.
std::vector<uint8_t> read_checked(const std::string& path, uint64_t size, const std::string& xxh64,
                                  const char* against) {
  std::vector<uint8_t> bytes;
  try {
    bytes = read_bytes(path);
  } catch (const IoError& e) {
    throw CorruptCheckpoint(e.what());
  }
  if (bytes.size() != size) {
    throw CorruptCheckpoint(path + ": " + std::to_string(bytes.size()) + " bytes, " + against +
                            " says " + std::to_string(size) + " (truncated?)");
  }
  const std::string sum = hex64(XXH64(bytes.data(), bytes.size(), /*seed=*/0));
  if (sum != xxh64) {
    throw CorruptCheckpoint(path + ": checksum " + sum + " differs from " + against + "'s " +
                            xxh64 + " (the file is corrupt)");
  }
  return bytes;
}

// A tensor being assembled from its pieces.
struct Assembly {
  std::vector<int64_t> shape;
  torch::Tensor flat;
  int64_t covered = 0;
};

// Copies the pieces of one verified shard file into `whole`.
void add_pieces(const nlohmann::json& desc, const std::string& path, const SafetensorsFile& file,
                std::map<std::string, Assembly>& whole) {
  std::map<std::string, torch::Tensor> data(file.tensors.begin(), file.tensors.end());
  for (const auto& p : desc.at("pieces")) {
    const auto name = p.at(0).get<std::string>();
    const auto shape = p.at(1).get<std::vector<int64_t>>();
    const auto offset = p.at(2).get<int64_t>();
    const auto it = data.find(name);
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    if (it == data.end() || offset < 0 || offset + it->second.numel() > numel) {
      throw CorruptCheckpoint(path + ": piece '" + name + "' is missing or out of range");
    }
    Assembly& a = whole[name];
    if (!a.flat.defined()) {
      a.shape = shape;
      a.flat = torch::empty({numel}, it->second.options());
    }
    a.flat.narrow(0, offset, it->second.numel()).copy_(it->second.reshape({-1}));
    a.covered += it->second.numel();
  }
}

// Reads, verifies and assembles the shard files of a sharded checkpoint into `state`.
void assemble_shards(State& state, const std::string& path) {
  std::map<std::string, Assembly> whole;
  for (const auto& desc : state.meta.at("shards")) {
    const std::string shard = dir_of(path) + "/" + desc.at("file").get<std::string>();
    const auto bytes = read_checked(shard, desc.at("bytes").get<uint64_t>(),
                                    desc.at("xxh64").get<std::string>(), path.c_str());
    SafetensorsFile file;
    try {
      file = parse_safetensors(bytes, shard);
    } catch (const FormatError& e) {
      throw CorruptCheckpoint(e.what());
    }
    if (const auto bad = restore_aliases(file); !bad.empty()) {
      throw CorruptCheckpoint(shard + ": " + bad);
    }
    add_pieces(desc, shard, file, whole);
  }
  for (auto& [name, a] : whole) {
    if (a.covered < a.flat.numel()) {
      throw CorruptCheckpoint(path + ": the shards hold only " + std::to_string(a.covered) +
                              " of the " + std::to_string(a.flat.numel()) + " elements of '" +
                              name + "'");
    }
    state.tensors.emplace_back(name, a.flat.view(a.shape));
  }
}

// A checkpoint written with tensor parallelism under fsdp: the parts
// "<name>@tp<rank>/<ranks>/<dim>/<groups>" of a tensor (util/tensor_split.h's split) joined into
// the whole tensor <name>.
void join_tensor_parallel_parts(State& state, const std::string& path) {
  struct Parts {
    TensorSplit split;
    std::vector<torch::Tensor> each;
  };
  std::map<std::string, Parts> split;
  NamedTensors kept;
  for (auto& [name, t] : state.tensors) {
    const auto at = name.rfind("@tp");
    int rank = 0, ranks = 0;
    int64_t dim = 0, groups = 0;
    if (at == std::string::npos ||
        std::sscanf(name.c_str() + at, "@tp%d/%d/%" SCNd64 "/%" SCNd64, &rank, &ranks, &dim,
                    &groups) != 4 ||
        rank < 0 || rank >= ranks || groups < 1) {
      kept.emplace_back(name, t);
      continue;
    }
    Parts& p = split[name.substr(0, at)];
    p.split = TensorSplit{dim, groups};
    p.each.resize(static_cast<size_t>(ranks));
    p.each[static_cast<size_t>(rank)] = t;
  }
  for (auto& [name, p] : split) {
    for (size_t r = 0; r < p.each.size(); ++r) {
      if (!p.each[r].defined()) {
        throw CorruptCheckpoint(path + ": the part of tensor-parallel rank " + std::to_string(r) +
                                " of '" + name + "' is missing");
      }
    }
    try {
      kept.emplace_back(name, join_parts(p.each, p.split));
    } catch (const c10::Error& e) {
      throw CorruptCheckpoint(path + ": the tensor-parallel parts of '" + name +
                              "' do not join: " + e.what_without_backtrace());
    }
  }
  state.tensors = std::move(kept);
}

State parse(const std::vector<uint8_t>& bytes, const std::string& path) {
  SafetensorsFile f;
  try {
    f = parse_safetensors(bytes, path);
  } catch (const FormatError& e) {
    throw CorruptCheckpoint(e.what());
  }
  auto it = f.metadata.find(kMetaKey);
  if (it == f.metadata.end()) {
    throw CorruptCheckpoint(path + ": not a trainer checkpoint (no '" + std::string(kMetaKey) +
                            "' metadata); for weights use model.pretrained");
  }
  State s;
  try {
    s.meta = nlohmann::json::parse(it->second);
  } catch (const nlohmann::json::exception& e) {
    throw CorruptCheckpoint(path + ": checkpoint metadata is not JSON: " + json_error_text(e));
  }
  if (const auto bad = restore_aliases(f); !bad.empty()) throw CorruptCheckpoint(path + ": " + bad);
  s.tensors = std::move(f.tensors);
  return s;
}

// Loads and verifies one file against its manifest entry (when given).
State load_verified(const std::string& path, const Entry* entry) {
  std::vector<uint8_t> bytes;
  if (entry) {
    bytes = read_checked(path, entry->bytes, entry->xxh64, "the manifest");
  } else {
    try {
      bytes = read_bytes(path);
    } catch (const IoError& e) {
      throw CorruptCheckpoint(e.what());
    }
  }
  State state = parse(bytes, path);
  if (state.meta.is_object() && state.meta.contains("shards")) {
    try {
      assemble_shards(state, path);
      join_tensor_parallel_parts(state, path);
    } catch (const nlohmann::json::exception& e) {
      throw CorruptCheckpoint(path + ": unreadable shard descriptions: " + e.what());
    }
  }
  return state;
}

}  // namespace

nlohmann::json write_shard(const std::string& dir, int64_t step, int rank, int world,
                           const std::vector<ShardPiece>& pieces) {
  const std::string shards = shards_dir(dir, step);
  for (const auto& d : {dir, shards}) {
    if (::mkdir(d.c_str(), 0755) != 0 && errno != EEXIST) {
      throw IoError(d + ": cannot create: " + std::strerror(errno));
    }
  }
  const std::string name = strprintf("rank_%05d_of_%05d.safetensors", rank, world);
  NamedTensors tensors;
  nlohmann::json index = nlohmann::json::array();
  for (const auto& p : pieces) {
    tensors.emplace_back(p.name, p.data);
    index.push_back({p.name, p.shape, p.offset});
  }
  std::map<std::string, std::string> metadata;
  tensors = stored_once(tensors, metadata);
  uint64_t bytes = 0;
  XXH64_state_t* hash = XXH64_createState();
  XXH64_reset(hash, /*seed=*/0);
  try {
    write_atomically(
        shards + "/" + name,
        [&](const ByteSink& sink) { write_safetensors(tensors, metadata, sink); },
        [&](const void* data, size_t size) {
          XXH64_update(hash, data, size);
          bytes += size;
        });
  } catch (...) {
    XXH64_freeState(hash);
    throw;
  }
  const std::string sum = hex64(XXH64_digest(hash));
  XXH64_freeState(hash);
  return {{"file", base_of(shards) + "/" + name},
          {"rank", rank},
          {"bytes", bytes},
          {"xxh64", sum},
          {"pieces", index}};
}

std::string xxh64_hex(const std::vector<uint8_t>& bytes) {
  return hex64(XXH64(bytes.data(), bytes.size(), /*seed=*/0));
}

int64_t checkpoint_step(const std::string& name) {
  int64_t step = -1;
  int used = 0;
  if (std::sscanf(name.c_str(), "step_%" SCNd64 ".safetensors%n", &step, &used) != 1 ||
      static_cast<size_t>(used) != name.size() || name != file_name(step)) {
    return -1;
  }
  return step;
}

Directory::Directory(std::string dir, int64_t keep_last, std::string keep_best)
    : dir_(std::move(dir)),
      keep_last_(std::max<int64_t>(keep_last, 1)),
      keep_best_(std::move(keep_best)) {}

void Directory::warn_once(const std::string& message) const {
  {
    const std::lock_guard<std::mutex> lock(warned_mutex_);
    if (!warned_.insert(message).second) return;
  }
  log::warn(message);
}

void Directory::remove_stale_temporaries() const {
  // Left by a process killed mid-write; one process writes a run's checkpoints at a time.
  std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir(dir_.c_str()), &::closedir);
  if (!dir) return;
  while (const dirent* e = ::readdir(dir.get())) {
    const std::string name = e->d_name;
    if (name.find(".tmp.") != std::string::npos) ::unlink((dir_ + "/" + name).c_str());
  }
}

std::vector<Entry> Directory::entries() const {
  auto listed = read_manifest(dir_, [this](const std::string& m) { warn_once(m); });
  std::vector<Entry> all = listed ? std::move(*listed) : std::vector<Entry>{};
  std::set<std::string> known;
  for (const auto& e : all) known.insert(e.file);
  std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir(dir_.c_str()), &::closedir);
  if (!dir) return all;
  std::vector<std::string> unlisted;
  while (const dirent* e = ::readdir(dir.get())) {
    if (checkpoint_step(e->d_name) >= 0 && !known.count(e->d_name))
      unlisted.emplace_back(e->d_name);
  }
  for (const auto& name : unlisted) {
    if (auto entry = adopt(name)) all.push_back(std::move(*entry));
  }
  std::sort(all.begin(), all.end(), [](const Entry& a, const Entry& b) { return a.step < b.step; });
  return all;
}

std::optional<Entry> Directory::adopt(const std::string& name) const {
  const std::string path = dir_ + "/" + name;
  try {
    const auto bytes = read_bytes(path);
    parse(bytes, path);  // throws unless it is a whole trainer checkpoint
    Entry entry;
    entry.file = name;
    entry.step = checkpoint_step(name);
    entry.bytes = bytes.size();
    entry.xxh64 = xxh64_hex(bytes);
    return entry;
  } catch (const std::exception& e) {
    warn_once(std::string(e.what()) + "; not a usable checkpoint, left as it is");
    return std::nullopt;
  }
}

void Directory::write_manifest(const std::vector<Entry>& entries) const {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& e : entries) {
    nlohmann::json j = {{"file", e.file}, {"step", e.step}, {"bytes", e.bytes}, {"xxh64", e.xxh64}};
    nlohmann::json metrics = nlohmann::json::object();
    for (const auto& [name, value] : e.metrics) {
      if (std::isfinite(value)) metrics[name] = value;  // JSON has no inf or NaN
    }
    if (!metrics.empty()) j["metrics"] = std::move(metrics);
    list.push_back(std::move(j));
  }
  const nlohmann::json manifest = {{"format", kFormat}, {"checkpoints", list}};
  write_text_atomically(dir_ + "/" + kManifest, manifest.dump(2) + "\n");
}

std::set<std::string> Directory::kept_files(const std::vector<Entry>& all) const {
  // The newest keep_last_, and the best by keep_best_.
  std::set<std::string> keep;
  for (size_t i = all.size() > static_cast<size_t>(keep_last_) ? all.size() - keep_last_ : 0;
       i < all.size(); ++i) {
    keep.insert(all[i].file);
  }
  if (keep_best_.empty()) return keep;
  const Entry* best = nullptr;
  for (const auto& e : all) {
    auto it = e.metrics.find(keep_best_);
    if (it == e.metrics.end()) continue;
    const double v = it->second;
    const double b = best ? best->metrics.at(keep_best_) : 0.0;
    if (!best || (lower_is_better(keep_best_) ? v < b : v > b)) best = &e;
  }
  if (best) keep.insert(best->file);
  return keep;
}

std::string Directory::save(int64_t step, const State& state,
                            const std::map<std::string, double>& metrics) {
  if (::mkdir(dir_.c_str(), 0755) != 0 && errno != EEXIST) {
    throw IoError(dir_ + ": cannot create: " + std::strerror(errno));
  }
  remove_stale_temporaries();
  Entry entry;
  entry.file = file_name(step);
  entry.step = step;
  entry.metrics = metrics;
  const std::string path = dir_ + "/" + entry.file;
  std::map<std::string, std::string> metadata{{kMetaKey, state.meta.dump()}};
  const NamedTensors tensors = stored_once(state.tensors, metadata);  // a tied weight once
  XXH64_state_t* hash = XXH64_createState();
  XXH64_reset(hash, /*seed=*/0);
  try {
    write_atomically(
        path, [&](const ByteSink& sink) { write_safetensors(tensors, metadata, sink); },
        [&](const void* data, size_t size) {
          XXH64_update(hash, data, size);
          entry.bytes += size;
        });
  } catch (...) {
    XXH64_freeState(hash);
    throw;
  }
  entry.xxh64 = hex64(XXH64_digest(hash));
  XXH64_freeState(hash);

  // The manifest: the new entry replaces any of the same step, then pruning.
  std::vector<Entry> all;
  for (auto& e : entries()) {
    if (e.step != step) all.push_back(std::move(e));
  }
  all.push_back(entry);
  std::sort(all.begin(), all.end(), [](const Entry& a, const Entry& b) { return a.step < b.step; });
  write_pruned(std::move(all));
  remove_unlisted_shard_files(step, state.meta);
  return path;
}

std::vector<Entry> Directory::write_pruned(std::vector<Entry> all) const {
  const std::set<std::string> keep = kept_files(all);
  std::vector<Entry> kept, dropped;
  for (auto& e : all) (keep.count(e.file) ? kept : dropped).push_back(std::move(e));
  write_manifest(kept);
  // Only once the manifest no longer names them.
  for (const auto& e : dropped) ::unlink((dir_ + "/" + e.file).c_str());
  remove_unkept_shards(kept);
  return kept;
}

void Directory::enter_unlisted() {
  const auto listed = read_manifest(dir_, [this](const std::string& m) { warn_once(m); });
  std::vector<Entry> all = entries();
  if (listed && listed->size() == all.size()) return;  // every file listed already
  if (!all.empty()) write_pruned(std::move(all));
}

void Directory::remove_unlisted_shard_files(int64_t step, const nlohmann::json& meta) const {
  // A step saved again by a job of another size: the earlier job's shard files beside the new.
  const std::string shards = shards_dir(dir_, step);
  std::set<std::string> listed;
  if (meta.contains("shards") && meta["shards"].is_array()) {
    for (const auto& s : meta["shards"]) {
      if (s.is_object() && s.contains("file") && s["file"].is_string()) {
        listed.insert(dir_ + "/" + s["file"].get<std::string>());
      }
    }
  }
  if (listed.empty()) {
    remove_shards(dir_, step);  // saved whole: no shard of this step is used
    return;
  }
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(shards.c_str()), &::closedir);
  if (!d) return;
  std::vector<std::string> stale;
  while (const dirent* e = ::readdir(d.get())) {
    const std::string name = e->d_name;
    if (name != "." && name != ".." && !listed.count(shards + "/" + name)) {
      stale.push_back(shards + "/" + name);
    }
  }
  for (const auto& path : stale) ::unlink(path.c_str());
}

void Directory::remove_unkept_shards(const std::vector<Entry>& kept) const {
  // Those of dropped checkpoints, and those of a save that ended before its checkpoint file.
  std::set<int64_t> steps;
  for (const auto& e : kept) steps.insert(e.step);
  std::vector<int64_t> unkept;
  std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir(dir_.c_str()), &::closedir);
  if (!dir) return;
  while (const dirent* e = ::readdir(dir.get())) {
    int64_t step = -1;
    int used = 0;
    if (std::sscanf(e->d_name, "step_%" SCNd64 ".shards%n", &step, &used) == 1 &&
        static_cast<size_t>(used) == std::strlen(e->d_name) && !steps.count(step)) {
      unkept.push_back(step);
    }
  }
  for (const int64_t step : unkept) remove_shards(dir_, step);
}

std::optional<std::pair<std::string, State>> Directory::load_latest() const {
  const auto all = entries();
  std::vector<std::string> failures;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const std::string path = dir_ + "/" + it->file;
    try {
      State state = load_verified(path, &*it);
      // Each newer one that failed, said once: here, or in the error when none verifies.
      for (const auto& f : failures) log::warn(f + "; trying the previous checkpoint");
      return std::make_pair(path, std::move(state));
    } catch (const CorruptCheckpoint& e) {
      failures.emplace_back(e.what());
    }
  }
  if (all.empty()) return std::nullopt;
  std::string msg;
  for (const auto& f : failures) msg += (msg.empty() ? "" : "; ") + f;
  throw CorruptCheckpoint("no checkpoint in " + dir_ + " verifies: " + msg +
                          " (move them away and rerun, or start over with run.overwrite: true)");
}

State load(const std::string& path) {
  for (const auto& e : read_manifest(dir_of(path)).value_or(std::vector<Entry>{})) {
    if (e.file == base_of(path)) return load_verified(path, &e);
  }
  log::warn(path + ": not listed in a manifest beside it; its checksum cannot be verified");
  return load_verified(path, nullptr);
}

}  // namespace trainer::checkpoint
