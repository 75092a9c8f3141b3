// The `preference` data set (data/tokens/preference.h): the files, the tokenizer, the splits, and
// batches of pairs as 2P rows [chosen; rejected].
#include "data/tokens/preference.h"

#include <torch/torch.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/formats/arrow_rows.h"
#include "data/tokens/json_array.h"
#include "data/tokens/jsonl_files.h"
#include "data/tokens/shards.h"
#include "text/chat/chat_encode.h"
#include "text/chat/chat_records.h"
#include "text/files.h"
#include "util/fileio.h"
#include "util/format.h"
#include "util/hash.h"
#include "util/log.h"

namespace trainer::data {
namespace {

// The tokenizer's path: data.tokenizer, else model.pretrained's folder.
std::string tokenizer_path(const PreferenceDataOptions& o, const DataContext& ctx) {
  std::string path = o.tokenizer.empty() ? ctx.pretrained : o.tokenizer;
  const char* key = o.tokenizer.empty() ? "model.pretrained" : "data.tokenizer";
  if (path.empty()) {
    throw DataConfigError("data.tokenizer",
                          "set it to a tokenizer.json or a Hugging Face model "
                          "folder (or set model.pretrained to one)");
  }
  if (!is_file(path) && !is_directory(path)) throw DataConfigError(key, input_problem(path));
  return path;
}

struct Reader {
  const PreferenceDataOptions& o;
  const BpeTokenizer& tokenizer;
  std::optional<ChatFormat> format;
  ChatSpecials specials;
  uint64_t seed;
  PreferenceData& data;

  // Every record of file `f` (`key` its config key) into a split: a validation file's into val,
  // else drawn from (seed, file, number) with chance data.val_fraction when `drawn`: a JSONL
  // line's number, array element i's i + 1, row N's N + 1.
  void read(const std::string& file, size_t f, const std::string& key, bool val_file, bool drawn) {
    auto split = [&](int64_t number) -> PreferencePairs& {
      const bool val =
          drawn ? drawn_for_validation(seed, f, static_cast<uint64_t>(number), o.val_fraction)
                : val_file;
      return val ? data.val : data.train;
    };
    if (is_rows_file(file)) return read_rows(file, key, split);
    const auto bytes = read_file(file);
    const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    if (starts_json_array(text)) {
      try {
        for (const auto& e : json_array_elements(text, file)) {
          add(e.text, file + ":" + std::to_string(e.line), key, split(e.index + 1));
        }
      } catch (const JsonArrayError& e) {
        throw DataConfigError(key, e.what());
      }
      return;
    }
    int64_t number = 0;
    for (size_t at = 0; at < text.size();) {
      size_t end = text.find('\n', at);
      if (end == std::string_view::npos) end = text.size();
      const auto line = text.substr(at, end - at);
      at = end + 1;
      ++number;
      if (blank_line(line)) continue;
      add(line, file + ":" + std::to_string(number), key, split(number));
    }
  }

  // The rows of a Parquet or Arrow stream file, each the record of TRL's columns (a null prompt:
  // none), read by batches of rows.
  template <class Split>
  void read_rows(const std::string& file, const std::string& key, Split& split) {
    try {
      std::vector<std::string> columns;
      if (ArrowRows(file).has_column("prompt")) columns.push_back("prompt");
      columns.insert(columns.end(), {"chosen", "rejected"});
      ArrowRows rows(file, columns);
      for (const auto& column : columns) require_text_or_messages(rows, column);
      nlohmann::ordered_json row;
      while (true) {
        const int64_t number = rows.position();
        if (!rows.next(row)) break;
        add(row.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace),
            rows.where(number), key, split(number + 1));
      }
    } catch (const ArrowRowsError& e) {
      throw DataConfigError(key, e.what());
    }
  }

  // TRL's columns hold text (strings) or conversations (lists of {role, content} structs).
  static void require_text_or_messages(const ArrowRows& rows, const std::string& column) {
    for (const auto kind : {ColumnKind::string, ColumnKind::struct_list}) {
      try {
        rows.require(column, kind);
        return;
      } catch (const ArrowRowsError&) {
      }
    }
    throw ArrowRowsError(rows.where(0) + ", column \"" + column +
                         "\": " + rows.column_type(column) +
                         " (every row), expected strings or lists of {role, content} structs "
                         "(TRL's preference columns)");
  }

  void add(std::string_view line, const std::string& where, const std::string& key,
           PreferencePairs& to) {
    PreferenceTokens t;
    try {
      t = tokenize_preference_line(line, where, tokenizer, format, specials);
    } catch (const PreferenceRecordError& e) {
      throw DataConfigError(key, e.what());
    }
    if (static_cast<int64_t>(t.prompt.size()) >= o.max_length) {  // TRL's filter
      if (++data.dropped <= 5) {
        log::warn(
            strprintf("preference: %s: the prompt's %zu tokens reach data.max_length (%lld); "
                      "dropped",
                      where.c_str(), t.prompt.size(), static_cast<long long>(o.max_length)));
      }
      return;
    }
    for (const auto* part : {&t.prompt, &t.chosen, &t.rejected}) {
      to.ids.insert(to.ids.end(), part->begin(), part->end());
      to.offsets.push_back(static_cast<int64_t>(to.ids.size()));
    }
    to.where.push_back(where);
  }
};

}  // namespace

PreferenceData read_preference_data(const config::DataConfig& cfg, const DataContext& ctx) {
  const auto& o = cfg.own<PreferenceDataOptions>();
  std::string path = tokenizer_path(o, ctx);
  if (o.tokenizer.empty() && is_file(path)) path = tokenizer_folder(path);  // a safetensors file
  BpeTokenizer tokenizer = [&] {
    try {
      return load_tokenizer(path);
    } catch (const TokenizerUnsupported& e) {
      throw DataConfigError("data.tokenizer", e.what());
    }
  }();
  const auto format = find_chat_format(o.chat_template, tokenizer_folder(path));
  if (!format && o.chat_template != "auto")
    pick_chat_format(o.chat_template, tokenizer_folder(path));
  PreferenceData data;
  data.vocab_size = tokenizer.vocab_size();
  const int64_t eot = tokenizer.end_of_text();
  data.pad_id = eot >= 0 ? eot : std::max<int64_t>(0, tokenizer.eos_id());
  const ChatSpecials specials =
      format ? chat_specials(tokenizer, *format, o.chat_date) : ChatSpecials{};
  const auto val = o.val_files.empty() ? std::vector<std::string>()
                                       : pattern_files(cfg.root, o.val_files, "data.val_files");
  const auto train =
      train_files(cfg.root, o.files, val, "preference pairs", {".jsonl", ".parquet", ".arrow"});
  Reader reader{o, tokenizer, format, specials, static_cast<uint64_t>(ctx.seed), data};
  const char* train_key = o.files.empty() ? "data.root" : "data.files";
  for (size_t f = 0; f < train.size(); ++f) reader.read(train[f], f, train_key, false, val.empty());
  for (size_t f = 0; f < val.size(); ++f) {
    reader.read(val[f], train.size() + f, "data.val_files", true, false);
  }
  if (data.dropped > 5) {
    log::warn(strprintf("preference: %lld pairs dropped in all (the first 5 above)",
                        static_cast<long long>(data.dropped)));
  }
  return data;
}

namespace {

// Batches of pairs: 2P rows [chosen; rejected], each prompt + completion cut to max_length and
// right-padded to the batch's longest row.
class PreferenceSamples final : public Dataset {
 public:
  PreferenceSamples(PreferencePairs pairs, int64_t max_length, int64_t pad)
      : pairs_(std::move(pairs)), max_length_(max_length), pad_(pad) {}

  int64_t size() const override { return pairs_.size(); }
  std::string sample_name(int64_t index) const override { return pairs_.where.at(index); }

 protected:
  Batch fetch(const std::vector<int64_t>& indices, const Epoch& /*epoch*/) const override {
    check_indices(indices, size(), "preference");
    const auto p = static_cast<int64_t>(indices.size());
    std::vector<std::vector<int32_t>> rows;
    std::vector<int64_t> prompt;  // per row: its prompt's tokens within it
    for (int part = 1; part <= 2; ++part) {
      for (const int64_t k : indices) {
        auto row = pairs_.part(k, 0);
        prompt.push_back(static_cast<int64_t>(row.size()));
        const auto completion = pairs_.part(k, part);
        row.insert(row.end(), completion.begin(), completion.end());
        if (static_cast<int64_t>(row.size()) > max_length_) row.resize(max_length_);
        rows.push_back(std::move(row));
      }
    }
    int64_t t = 1;
    for (const auto& row : rows) t = std::max<int64_t>(t, static_cast<int64_t>(row.size()));
    auto inputs = torch::full({2 * p, t}, pad_, torch::kInt64);
    auto targets = torch::full({2 * p, t}, kIgnoreTarget, torch::kInt64);
    auto* in = inputs.data_ptr<int64_t>();
    auto* out = targets.data_ptr<int64_t>();
    for (int64_t r = 0; r < 2 * p; ++r) {
      const auto& row = rows[static_cast<size_t>(r)];
      const auto n = static_cast<int64_t>(row.size());
      for (int64_t j = 0; j < n; ++j) in[r * t + j] = row[static_cast<size_t>(j)];
      for (int64_t j = std::max<int64_t>(prompt[static_cast<size_t>(r)], 1); j < n; ++j) {
        out[r * t + j - 1] = row[static_cast<size_t>(j)];  // a completion token, predicted at j-1
      }
    }
    return Batch{inputs, targets};
  }

 private:
  PreferencePairs pairs_;
  int64_t max_length_;
  int64_t pad_;
};

int64_t completion_tokens(const PreferencePairs& pairs) {
  int64_t n = 0;
  for (int64_t k = 0; k < pairs.size(); ++k) {
    n += pairs.offsets[3 * k + 3] - pairs.offsets[3 * k + 1];
  }
  return n;
}

Splits make_preference(const config::DataConfig& cfg, const DataContext& ctx) {
  const auto& o = cfg.own<PreferenceDataOptions>();
  PreferenceData data = read_preference_data(cfg, ctx);
  if (data.train.size() == 0) {
    throw DataConfigError(o.files.empty() ? "data.root" : "data.files",
                          "no preference pair to train on in the files");
  }
  if (data.val.size() == 0) {
    throw DataConfigError(o.val_files.empty() ? "data.val_fraction" : "data.val_files",
                          strprintf("no pair validates (of %lld); raise data.val_fraction or set "
                                    "data.val_files",
                                    static_cast<long long>(data.train.size())));
  }
  log::info(strprintf("preference: %lld train and %lld val pairs, %lld completion tokens%s",
                      static_cast<long long>(data.train.size()),
                      static_cast<long long>(data.val.size()),
                      static_cast<long long>(completion_tokens(data.train)),
                      data.dropped ? strprintf(" (%lld pairs dropped: their prompt reaches "
                                               "data.max_length)",
                                               static_cast<long long>(data.dropped))
                                         .c_str()
                                   : ""));
  Splits splits;
  splits.spec.sample_shape = {o.max_length};
  splits.spec.sequence = true;
  splits.spec.num_classes = data.vocab_size;
  splits.spec.vocabulary_known = true;
  splits.train =
      std::make_shared<PreferenceSamples>(std::move(data.train), o.max_length, data.pad_id);
  splits.val = std::make_shared<PreferenceSamples>(std::move(data.val), o.max_length, data.pad_id);
  return splits;
}

}  // namespace

void PreferenceDataOptions::validate(config::Checks& c) const {
  c.at_least("max_length", max_length, 2);
  check_val_fraction(c, val_fraction);
  std::vector<std::string> templates = {"auto"};
  for (const auto& name : chat_format_names()) templates.push_back(name);
  c.one_of("chat_template", chat_template, templates);
}

void register_preference(DatasetRegistry& registry) {
  registry.add("preference", make_preference, config::options_of<PreferenceDataOptions>());
}

}  // namespace trainer::data
