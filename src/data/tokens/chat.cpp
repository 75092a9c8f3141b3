// The `chat` data set (data/tokens/chat.h): the conversations of read_chat_data cut to
// data.seq_len, one or several (data.pack) to a sample.
#include "data/tokens/chat.h"

#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/chat/chat_encode.h"
#include "util/format.h"
#include "util/log.h"

namespace trainer::data {
namespace {

// The conversations of a split that samples hold, and which conversations each sample holds.
struct Layout {
  std::vector<int64_t> length;   // by conversation: the input positions it takes (0: dropped)
  std::vector<int64_t> begin;    // sample s holds members [begin[s], begin[s + 1])
  std::vector<int64_t> members;  // conversation indices
  int64_t cut = 0;               // dropped: their first trained token lies beyond seq_len
};

// Samples of seq_len tokens: inputs a conversation's tokens but its last, targets the next tokens
// (kIgnoreTarget where they do not train), padding after; packed rows with Batch::positions.
class ChatSamples final : public Dataset {
 public:
  ChatSamples(std::shared_ptr<const ChatConversations> conversations, Layout layout,
              int64_t seq_len, bool packed, int64_t pad)
      : c_(std::move(conversations)),
        layout_(std::move(layout)),
        seq_len_(seq_len),
        packed_(packed),
        pad_(pad) {}

  int64_t size() const override { return static_cast<int64_t>(layout_.begin.size()) - 1; }

  std::string sample_name(int64_t index) const override {
    const int64_t first = layout_.begin[index], n = layout_.begin[index + 1] - first;
    const std::string name = c_->name(layout_.members[first]);
    return n > 1 ? name + " and " + std::to_string(n - 1) + " more" : name;
  }

 protected:
  Batch fetch(const std::vector<int64_t>& indices, const Epoch& /*epoch*/) const override {
    check_indices(indices, size(), "chat");
    const auto b = static_cast<int64_t>(indices.size());
    const int64_t t = seq_len_;
    auto inputs = torch::full({b, t}, pad_, torch::kInt64);              // [B, T]
    auto targets = torch::full({b, t}, kIgnoreTarget, torch::kInt64);    // [B, T]
    auto positions = torch::zeros({packed_ ? b : 0, t}, torch::kInt64);  // [B, T] packed
    auto* in = inputs.data_ptr<int64_t>();
    auto* out = targets.data_ptr<int64_t>();
    auto* pos = positions.data_ptr<int64_t>();
    for (int64_t i = 0; i < b; ++i) {
      const int64_t s = indices[static_cast<size_t>(i)];
      int64_t at = i * t;
      for (int64_t m = layout_.begin[s]; m < layout_.begin[s + 1]; ++m) {
        const int64_t c = layout_.members[m], first = c_->offsets[c];
        for (int64_t j = 0; j < layout_.length[c]; ++j, ++at) {
          in[at] = c_->ids[first + j];
          if (c_->trained[first + j + 1]) out[at] = c_->ids[first + j + 1];
          if (packed_) pos[at] = j;
        }
      }
      for (int64_t j = 0; packed_ && at < (i + 1) * t; ++j, ++at) pos[at] = j;  // padding
    }
    Batch batch{inputs, targets};
    if (packed_) batch.positions = positions;
    return batch;
  }

 private:
  std::shared_ptr<const ChatConversations> c_;
  Layout layout_;
  int64_t seq_len_;
  bool packed_;
  int64_t pad_;
};

// Each conversation cut to seq_len + 1 tokens (seq_len input positions); dropped where its first
// trained token is cut off.
Layout cut_to(const ChatConversations& c, int64_t seq_len) {
  Layout layout;
  layout.length.assign(static_cast<size_t>(c.size()), 0);
  for (int64_t k = 0; k < c.size(); ++k) {
    const auto first = c.trained.begin() + c.offsets[k];
    const int64_t trained = std::find(first, c.trained.begin() + c.offsets[k + 1], 1) - first;
    if (trained > seq_len) {
      ++layout.cut;
      continue;
    }
    layout.length[k] = std::min(c.length(k), seq_len + 1) - 1;
  }
  return layout;
}

// One conversation a sample, in file order.
void one_each(Layout& layout) {
  layout.begin = {0};
  for (int64_t k = 0; k < static_cast<int64_t>(layout.length.size()); ++k) {
    if (layout.length[k] == 0) continue;
    layout.members.push_back(k);
    layout.begin.push_back(static_cast<int64_t>(layout.members.size()));
  }
}

// Best fit decreasing: the longest conversation first, each into the sample with the least room
// that holds it (the earliest made among equals), else a new one.
void pack(Layout& layout, int64_t seq_len) {
  std::vector<int64_t> order;
  for (int64_t k = 0; k < static_cast<int64_t>(layout.length.size()); ++k) {
    if (layout.length[k] > 0) order.push_back(k);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return layout.length[a] > layout.length[b]; });
  std::vector<std::vector<int64_t>> bins;
  std::multimap<int64_t, size_t> room;  // free positions -> sample
  for (const int64_t k : order) {
    const int64_t n = layout.length[k];
    auto it = room.lower_bound(n);
    size_t bin = bins.size();
    int64_t left = seq_len - n;
    if (it == room.end()) {
      bins.emplace_back();
    } else {
      bin = it->second;
      left = it->first - n;
      room.erase(it);
    }
    bins[bin].push_back(k);
    if (left > 0) room.emplace(left, bin);
  }
  layout.begin = {0};
  for (const auto& members : bins) {
    layout.members.insert(layout.members.end(), members.begin(), members.end());
    layout.begin.push_back(static_cast<int64_t>(layout.members.size()));
  }
}

}  // namespace

std::shared_ptr<const Dataset> conversation_split(ChatConversations&& conversations,
                                                  const char* split, int64_t seq_len, bool packed,
                                                  int64_t pad) {
  auto c = std::make_shared<const ChatConversations>(std::move(conversations));
  Layout layout = cut_to(*c, seq_len);
  packed ? pack(layout, seq_len) : one_each(layout);
  int64_t tokens = 0, trained = 0;
  for (const int64_t k : layout.members) {
    tokens += layout.length[k];
    const auto first = c->trained.begin() + c->offsets[k] + 1;
    trained += std::count(first, first + layout.length[k], 1);
  }
  const auto samples = static_cast<int64_t>(layout.begin.size()) - 1;
  if (samples == 0) {
    throw DataConfigError(
        "data.seq_len",
        strprintf("no %s conversation keeps a trained token within %lld tokens "
                  "(%lld cut off); raise data.seq_len",
                  split, static_cast<long long>(seq_len), static_cast<long long>(layout.cut)));
  }
  log::info(strprintf(
      "%s: %lld conversations%s, %lld tokens, %.1f%% trained; %lld %s of %lld tokens, "
      "%.1f%% of their positions used",
      split, static_cast<long long>(layout.members.size()),
      layout.cut == 0 ? ""
                      : strprintf(" (%lld more dropped: their first trained token lies beyond "
                                  "data.seq_len)",
                                  static_cast<long long>(layout.cut))
                            .c_str(),
      static_cast<long long>(tokens), 100.0 * static_cast<double>(trained) / tokens,
      static_cast<long long>(samples), packed ? "packed samples" : "samples",
      static_cast<long long>(seq_len),
      100.0 * static_cast<double>(tokens) / (static_cast<double>(samples) * seq_len)));
  return std::make_shared<ChatSamples>(std::move(c), std::move(layout), seq_len, packed, pad);
}

namespace {

// data.seq_len, or the longest conversation's input positions (at most the model's context).
int64_t pick_seq_len(const ChatOptions& o, const ChatData& data, const DataContext& ctx) {
  if (o.seq_len > 0) return o.seq_len;
  int64_t longest = 1;
  for (const auto* c : {&data.train, &data.val}) {
    for (int64_t k = 0; k < c->size(); ++k) longest = std::max(longest, c->length(k) - 1);
  }
  const int64_t n = ctx.context_length > 0 ? std::min(longest, ctx.context_length) : longest;
  log::info(strprintf("chat: data.seq_len 0: samples of %lld tokens (the longest conversation's%s)",
                      static_cast<long long>(n),
                      n < longest ? ", cut to the model's context length" : ""));
  return n;
}

Splits make_chat(const config::DataConfig& cfg, const DataContext& ctx) {
  const auto& o = cfg.own<ChatOptions>();
  ChatData data = read_chat_data(cfg, ctx);
  if (data.train.size() == 0) {
    throw DataConfigError(o.files.empty() ? "data.root" : "data.files",
                          "no conversation to train on in the files");
  }
  if (data.val.size() == 0) {
    throw DataConfigError(o.val_files.empty() ? "data.val_fraction" : "data.val_files",
                          strprintf("no conversation validates (of %lld); raise "
                                    "data.val_fraction or set data.val_files",
                                    static_cast<long long>(data.train.size())));
  }
  const int64_t seq_len = pick_seq_len(o, data, ctx);
  Splits splits;
  splits.spec.sample_shape = {seq_len};
  splits.spec.sequence = true;
  splits.spec.num_classes = data.vocab_size;
  splits.spec.vocabulary_known = true;  // the tokenizer's
  splits.spec.packed = o.pack;
  splits.train =
      conversation_split(std::move(data.train), "chat train", seq_len, o.pack, data.pad_id);
  splits.val = conversation_split(std::move(data.val), "chat val", seq_len, o.pack, data.pad_id);
  return splits;
}

}  // namespace

void ChatOptions::validate(config::Checks& c) const {
  c.at_least("seq_len", seq_len, 0);
  check_val_fraction(c, val_fraction);
  std::vector<std::string> templates = {"auto"};
  for (const auto& name : chat_format_names()) templates.push_back(name);
  c.one_of("chat_template", chat_template, templates);
  c.one_of("train_on", train_on, train_on_names());
  c.one_of("format", format, record_format_names());
  if (!record_format_named(format)) return;
  for (const auto& [key, message] : record_mapping_problems(record_mapping())) c.add(key, message);
}

RecordMapping ChatOptions::record_mapping() const {
  RecordMapping m;
  m.format = record_format_named(format).value_or(RecordFormat::automatic);
  m.messages_key = messages_key;
  m.role_key = role_key;
  m.content_key = content_key;
  m.system_key = system_key;
  m.instruction_key = instruction_key;
  m.input_key = input_key;
  m.output_key = output_key;
  m.history_key = history_key;
  m.user_role = user_role;
  m.assistant_role = assistant_role;
  m.system_role = system_role;
  m.tool_role = tool_role;
  m.tool_call_role = tool_call_role;
  return m;
}

void register_chat(DatasetRegistry& registry) {
  registry.add("chat", make_chat, config::options_of<ChatOptions>());
}

}  // namespace trainer::data
