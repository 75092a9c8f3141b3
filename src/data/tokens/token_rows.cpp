// Token rows (data.name: token_rows): samples that come tokenized, a row each, as MLPerf's Llama 2
// 70B LoRA data set (SCROLLS GovReport: rows of 8,192 Llama 2 ids) and datasets' tokenized data
// sets hold them: `input_ids`, with `labels` (-100 where a token is no target: the prompt, the
// padding) or an `attention_mask` (0 on padding), in Parquet, Arrow stream or JSONL files
// (data/tokens/jsonl_files.h finds them). A row is a sample of its own, as transformers' causal
// LM reads it: inputs its ids but the last, targets the ids after them, where labels allow; no
// sample crosses a row (data.pack: true packs rows, attention kept inside each). Padding to
// data.seq_len is masked. The samples are the chat data set's (data/tokens/chat.h).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/formats/arrow_rows.h"
#include "data/tokens/chat.h"
#include "data/tokens/jsonl_files.h"
#include "text/files.h"
#include "util/fileio.h"
#include "util/format.h"
#include "util/hash.h"
#include "util/log.h"

namespace trainer::data {
namespace {

// The `data.` keys of token_rows.
struct TokenRowsOptions {
  std::string files;          // the training files (.parquet, .arrow, .jsonl), as chat's
  std::string val_files;      // the validation files; empty: a seeded data.val_fraction
  double val_fraction = 0.1;  // without val_files: each row's chance to validate
  int64_t seq_len = 0;        // tokens per sample; 0: the longest row's (at most the context)
  bool pack = false;          // several rows a sample, attention kept inside each
  std::string ids_key = "input_ids";        // the column of a row's token ids
  std::string labels_key = "labels";        // its targets, -100 where none; "" or absent: all
  std::string mask_key = "attention_mask";  // 0 on padding (no target); "" or absent: none
  int64_t pad_id = 0;                       // the input of padding positions

  template <class V>
  void visit(V& v) {
    v("files", files);
    v("val_files", val_files);
    v("val_fraction", val_fraction);
    v("seq_len", seq_len);
    v("pack", pack);
    v("ids_key", ids_key);
    v("labels_key", labels_key);
    v("mask_key", mask_key);
    v("pad_id", pad_id);
  }
  void validate(config::Checks& c) const {
    c.at_least("seq_len", seq_len, 0);
    c.at_least("pad_id", pad_id, 0);
    check_val_fraction(c, val_fraction);
    if (ids_key.empty()) c.add("ids_key", "names the column of the token ids; give one");
  }
};

constexpr int64_t kIgnoreLabel = -100;  // transformers' ignore index

// One row: its ids and, where given, labels and mask (empty when the file lacks the column).
struct Row {
  std::vector<int64_t> ids, labels, mask;
};

// The row's trained flags: token t is a target where labels[t] != -100 (then labels[t] must be
// ids[t], as a causal LM's labels are its inputs) and mask[t] != 0. Throws DataConfigError naming
// `where` and the column.
std::vector<uint8_t> trained_flags(const Row& r, const std::string& where,
                                   const TokenRowsOptions& o, const std::string& key) {
  const auto n = r.ids.size();
  using Column = std::pair<const std::vector<int64_t>*, const std::string*>;
  for (const auto& [list, column] :
       {Column{&r.labels, &o.labels_key}, Column{&r.mask, &o.mask_key}}) {
    if (!list->empty() && list->size() != n) {
      throw DataConfigError(
          key, strprintf("%s: column \"%s\" holds %zu values, \"%s\" %zu; give "
                         "one a token",
                         where.c_str(), column->c_str(), list->size(), o.ids_key.c_str(), n));
    }
  }
  std::vector<uint8_t> trained(n, 1);
  for (size_t t = 0; t < n; ++t) {
    if (r.ids[t] < 0 || r.ids[t] > INT32_MAX) {
      throw DataConfigError(key,
                            strprintf("%s: column \"%s\"[%zu] is %lld, no token id", where.c_str(),
                                      o.ids_key.c_str(), t, static_cast<long long>(r.ids[t])));
    }
    if (!r.mask.empty() && r.mask[t] == 0) trained[t] = 0;
    if (r.labels.empty()) continue;
    if (r.labels[t] == kIgnoreLabel) {
      trained[t] = 0;
    } else if (r.labels[t] != r.ids[t]) {
      throw DataConfigError(
          key,
          strprintf("%s: column \"%s\"[%zu] is %lld but \"%s\"[%zu] %lld: a causal LM's "
                    "labels are its input ids (the model shifts them), or -100 where a "
                    "token is no target",
                    where.c_str(), o.labels_key.c_str(), t, static_cast<long long>(r.labels[t]),
                    o.ids_key.c_str(), t, static_cast<long long>(r.ids[t])));
    }
  }
  return trained;
}

// Reading the rows of the files into the splits.
struct RowReader {
  const TokenRowsOptions& o;
  size_t first_val = 0;
  bool root_key = false;
  uint64_t seed = 0;
  ChatConversations train, val;
  int64_t largest = 0;  // the largest id

  std::string key(size_t f) const {
    return f >= first_val ? "data.val_files" : root_key ? "data.root" : "data.files";
  }

  // Row `number` of file `f` (a line's from 1, a row's from 0) into its split.
  void take(size_t f, int64_t number, const Row& r) {
    const auto where = train.record_name(static_cast<int32_t>(f), number);
    if (r.ids.size() < 2) {
      throw DataConfigError(key(f), where + ": fewer than 2 tokens: no target to train");
    }
    const auto trained = trained_flags(r, where, o, key(f));
    const bool drawn = first_val == train.files.size();
    const auto n = static_cast<uint64_t>(number + (train.rows[f] ? 1 : 0));
    const bool is_val = drawn ? drawn_for_validation(seed, f, n, o.val_fraction) : f >= first_val;
    auto& to = is_val ? val : train;
    for (const int64_t id : r.ids) {
      to.ids.push_back(static_cast<int32_t>(id));
      largest = std::max(largest, id);
    }
    to.trained.insert(to.trained.end(), trained.begin(), trained.end());
    to.offsets.push_back(static_cast<int64_t>(to.ids.size()));
    to.file.push_back(static_cast<int32_t>(f));
    to.line.push_back(number);
  }

  void read_rows(size_t f) {
    try {
      ArrowRows file(train.files[f]);
      std::vector<std::string> columns = {o.ids_key};
      for (const auto* c : {&o.labels_key, &o.mask_key}) {
        if (!c->empty() && file.has_column(*c)) columns.push_back(*c);
      }
      ArrowRows rows(train.files[f], columns);
      for (const auto& c : columns) rows.require(c, ColumnKind::integer_list);
      std::vector<std::vector<int64_t>> lists;
      while (rows.next_integer_lists(lists)) {
        Row r;
        r.ids = std::move(lists[0]);
        for (size_t i = 1; i < columns.size(); ++i) {
          (columns[i] == o.labels_key ? r.labels : r.mask) = std::move(lists[i]);
        }
        take(f, rows.position() - 1, r);
      }
    } catch (const ArrowRowsError& e) {
      throw DataConfigError(key(f), e.what());
    }
  }

  // A JSON line's integer list `column`; empty when absent (not for the ids).
  std::vector<int64_t> list_of(const nlohmann::json& j, const std::string& column,
                               const std::string& where, size_t f, bool needed) const {
    if (column.empty() || !j.contains(column) || j[column].is_null()) {
      if (needed) throw DataConfigError(key(f), where + ": no \"" + column + "\" list");
      return {};
    }
    try {
      return j[column].get<std::vector<int64_t>>();
    } catch (const nlohmann::json::exception&) {
      throw DataConfigError(key(f), where + ": \"" + column + "\" is not a list of integers");
    }
  }

  void read_jsonl(size_t f) {
    const auto bytes = read_file(train.files[f]);
    const std::string text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    size_t start = 0;
    for (int64_t number = 1; start < text.size(); ++number) {
      const size_t end = std::min(text.find('\n', start), text.size());
      const std::string line = text.substr(start, end - start);
      start = end + 1;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const auto where = train.record_name(static_cast<int32_t>(f), number);
      const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!j.is_object()) throw DataConfigError(key(f), where + ": not a JSON object");
      Row r;
      r.ids = list_of(j, o.ids_key, where, f, true);
      r.labels = list_of(j, o.labels_key, where, f, false);
      r.mask = list_of(j, o.mask_key, where, f, false);
      take(f, number, r);
    }
  }
};

Splits make_token_rows(const config::DataConfig& cfg, const DataContext& ctx) {
  const auto& o = cfg.own<TokenRowsOptions>();
  const auto val = o.val_files.empty() ? std::vector<std::string>()
                                       : pattern_files(cfg.root, o.val_files, "data.val_files");
  RowReader reader{o, 0, o.files.empty(), static_cast<uint64_t>(ctx.seed), {}, {}, 0};
  auto& files = reader.train.files;
  files = train_files(cfg.root, o.files, val, "token rows", {".parquet", ".arrow", ".jsonl"});
  reader.first_val = files.size();
  files.insert(files.end(), val.begin(), val.end());
  for (const auto& f : files) reader.train.rows.push_back(is_rows_file(f) ? 1 : 0);
  reader.val.files = files;
  reader.val.rows = reader.train.rows;
  for (size_t f = 0; f < files.size(); ++f) {
    reader.train.rows[f] ? reader.read_rows(f) : reader.read_jsonl(f);
  }
  if (reader.train.size() == 0 || reader.val.size() == 0) {
    throw DataConfigError(reader.train.size() == 0 ? (o.files.empty() ? "data.root" : "data.files")
                                                   : "data.val_fraction",
                          strprintf("%lld training and %lld validation rows; both need one",
                                    static_cast<long long>(reader.train.size()),
                                    static_cast<long long>(reader.val.size())));
  }
  int64_t seq_len = o.seq_len;
  if (seq_len == 0) {
    for (const auto* c : {&reader.train, &reader.val}) {
      for (int64_t k = 0; k < c->size(); ++k) seq_len = std::max(seq_len, c->length(k) - 1);
    }
    if (ctx.context_length > 0) seq_len = std::min(seq_len, ctx.context_length);
  }
  Splits splits;
  splits.spec.sample_shape = {seq_len};
  splits.spec.sequence = true;
  splits.spec.num_classes = std::max(reader.largest, o.pad_id) + 1;  // at least; the model's
  splits.spec.packed = o.pack;
  splits.train =
      conversation_split(std::move(reader.train), "token_rows train", seq_len, o.pack, o.pad_id);
  splits.val =
      conversation_split(std::move(reader.val), "token_rows val", seq_len, o.pack, o.pad_id);
  return splits;
}

}  // namespace

void register_token_rows(DatasetRegistry& registry) {
  registry.add("token_rows", make_token_rows, config::options_of<TokenRowsOptions>());
}

}  // namespace trainer::data
