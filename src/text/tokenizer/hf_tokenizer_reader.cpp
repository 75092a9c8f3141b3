#include "text/tokenizer/hf_tokenizer_reader.h"

#include <cstdint>
#include <limits>
#include <utility>

#include "text/error.h"
#include "text/tokenizer/hf_tokenizer_scan.h"
#include "util/json_error.h"

namespace trainer::data {
namespace {

using Json = nlohmann::json;

// Builds a document from SAX events as nlohmann's own parser does (a repeated key: its last
// value).
class DomBuilder {
 public:
  explicit DomBuilder(Json& root) : root_(&root) {}

  // Puts `v` where the parse is; returns it.
  Json* value(Json&& v) {
    if (stack_.empty()) {
      *root_ = std::move(v);
      return root_;
    }
    if (stack_.back()->is_array()) {
      stack_.back()->emplace_back(std::move(v));
      return &stack_.back()->back();
    }
    *member_ = std::move(v);
    return member_;
  }
  void open(Json&& container) { stack_.push_back(value(std::move(container))); }
  void key(const std::string& k) { member_ = &(*stack_.back())[k]; }
  void close() { stack_.pop_back(); }

 private:
  Json* root_;
  std::vector<Json*> stack_;
  Json* member_ = nullptr;
};

// The SAX handler (nlohmann's sax_parse): `depth_` counts the containers open, the root's keys
// are met at depth 1, the model's at 2, model.vocab's and model.merges' entries at 3.
class TokenizerSax {
 public:
  TokenizerSax(Json& root, TokenizerLists& lists, const std::string& path)
      : doc_(root), element_dom_(element_), lists_(lists), path_(path) {}

  bool null() { return scalar(Json()); }
  bool boolean(bool v) { return scalar(Json(v)); }
  bool number_integer(int64_t v) { return scalar(Json(v)); }
  bool number_unsigned(uint64_t v) {
    if (mode_ == Mode::kVocab && v <= static_cast<uint64_t>(INT64_MAX)) {
      lists_.ids.push_back(static_cast<int64_t>(v));
      return true;
    }
    return scalar(Json(v));
  }
  bool number_float(double v, const std::string&) { return scalar(Json(v)); }
  bool binary(Json::binary_t&) { return scalar(Json()); }  // not met in JSON text
  bool string(std::string& v) {
    if (mode_ == Mode::kMerges) {
      merge_text(v);
    } else if (mode_ == Mode::kPair && pair_count_ < 2) {
      auto& pair = lists_.merges.back();
      (pair_count_++ == 0 ? pair.first : pair.second) = v;
    } else {
      return scalar(Json(v));
    }
    return true;
  }

  bool key(std::string& k) {
    if (mode_ == Mode::kVocab) {
      lists_.tokens.push_back(k);  // its id comes next
    } else if (mode_ == Mode::kElement) {
      element_dom_.key(k);
    } else if (mode_ == Mode::kDocument) {
      if (depth_ == 1) key_root_ = k;
      if (depth_ == 2) key_model_ = k;
      doc_.key(k);
    }
    return true;
  }

  bool start_object(std::size_t) { return start(true); }
  bool start_array(std::size_t) { return start(false); }
  bool end_object() { return end(); }
  bool end_array() { return end(); }

  bool parse_error(std::size_t, const std::string&, const Json::exception& e) {
    throw TokenizerError(not_json_message(path_, e));
  }

 private:
  // kDocument: into the document; kVocab: model.vocab's entries; kMerges: model.merges'
  // entries; kPair: inside a merge written as a list (strings so far); kElement: inside one
  // that is not two strings (built to be named); kSkip: inside an entry not kept.
  enum class Mode { kDocument, kVocab, kMerges, kPair, kElement, kSkip };

  bool in_model() const { return depth_ == 2 && model_open_; }

  bool scalar(Json&& v) {
    switch (mode_) {
      case Mode::kDocument:
        doc_.value(std::move(v));
        break;
      case Mode::kVocab:
        add_odd_id(std::move(v));
        break;
      case Mode::kMerges:
        bad_merge(v.dump());
        break;
      case Mode::kPair:
        to_element();
        element_dom_.value(std::move(v));
        break;
      case Mode::kElement:
        element_dom_.value(std::move(v));
        break;
      case Mode::kSkip:
        break;
    }
    return true;
  }

  bool start(bool object) {
    Json empty = object ? Json::object() : Json::array();
    switch (mode_) {
      case Mode::kDocument:
        if (in_model() && object && key_model_ == "vocab") {
          doc_.value(std::move(empty));
          lists_.vocab_object = true;
          mode_ = Mode::kVocab;
        } else if (in_model() && !object && key_model_ == "merges") {
          doc_.value(std::move(empty));
          lists_.merges_array = true;
          mode_ = Mode::kMerges;
        } else {
          if (depth_ == 1) model_open_ = object && key_root_ == "model";
          doc_.open(std::move(empty));
        }
        break;
      case Mode::kVocab:
        add_odd_id(Json(object ? "{...}" : "[...]"));
        skip(Mode::kVocab);
        break;
      case Mode::kMerges:
        if (object) {
          bad_merge("{...}");
          skip(Mode::kMerges);
        } else {
          lists_.merges.emplace_back();  // filled in place
          pair_count_ = 0;
          mode_ = Mode::kPair;
        }
        break;
      case Mode::kPair:
        to_element();
        element_dom_.open(std::move(empty));
        break;
      case Mode::kElement:
        element_dom_.open(std::move(empty));
        break;
      case Mode::kSkip:
        break;
    }
    ++depth_;
    return true;
  }

  bool end() {
    --depth_;
    switch (mode_) {
      case Mode::kDocument:
        doc_.close();
        if (depth_ == 1) model_open_ = false;
        break;
      case Mode::kVocab:
      case Mode::kMerges:
        mode_ = Mode::kDocument;  // the list's end
        break;
      case Mode::kPair:
        if (pair_count_ != 2) {
          to_element();
          bad_merge(element_.dump());
        }
        mode_ = Mode::kMerges;
        break;
      case Mode::kElement:
        element_dom_.close();
        if (depth_ == 3) {
          bad_merge(element_.dump());
          mode_ = Mode::kMerges;
        }
        break;
      case Mode::kSkip:
        if (depth_ == 3) mode_ = back_;
        break;
    }
    return true;
  }

  void skip(Mode back) {
    back_ = back;
    mode_ = Mode::kSkip;
  }

  void add_odd_id(Json&& v) {
    lists_.ids.push_back(-1 - static_cast<int64_t>(lists_.odd.size()));
    lists_.odd.push_back(std::move(v));
  }

  // A merge written as one string: "a b".
  void merge_text(const std::string& m) {
    const auto space = m.find(' ');
    if (space != std::string::npos && m.find(' ', space + 1) == std::string::npos) {
      lists_.merges.emplace_back(m.substr(0, space), m.substr(space + 1));
    } else {
      bad_merge(Json(m).dump());
    }
  }

  // A merge written as a list turns out not to be two strings: from here it is built, to be
  // named.
  void to_element() {
    element_dom_ = DomBuilder(element_);
    element_dom_.open(Json::array());  // element_: the list, open
    auto& pair = lists_.merges.back();
    if (pair_count_ > 0) element_.push_back(std::move(pair.first));
    if (pair_count_ > 1) element_.push_back(std::move(pair.second));
    lists_.merges.pop_back();  // bad_merge() puts its place back
    mode_ = Mode::kElement;
  }

  // A malformed merge, `text` as its JSON (or "{...}" for an object).
  void bad_merge(std::string text) {
    if (lists_.bad_merge < 0) {
      lists_.bad_merge = static_cast<int64_t>(lists_.merges.size());
      lists_.bad_merge_text = std::move(text);
    }
    lists_.merges.emplace_back();  // keeps the ranks of those after it
  }

  DomBuilder doc_;
  Json element_;  // a malformed merge written as a list
  DomBuilder element_dom_;
  TokenizerLists& lists_;
  const std::string& path_;
  Mode mode_ = Mode::kDocument, back_ = Mode::kDocument;
  int depth_ = 0;
  bool model_open_ = false;  // whether the root's "model" object is open
  std::string key_root_, key_model_;
  int pair_count_ = 0;  // strings in the merge being read (model.merges' last entry)
};

}  // namespace

Json read_tokenizer_document(const std::string& text, const std::string& path,
                             TokenizerLists& lists, bool fast) {
  if (fast) {
    // Room for a big vocabulary's entries (one of at least 24 bytes of the file) saves growing
    // the lists many times; the space not used is never touched.
    lists.tokens.reserve(text.size() / 24);
    lists.ids.reserve(text.size() / 24);
    lists.merges.reserve(text.size() / 24);
    Json root;
    TokenizerSax sax(root, lists, path);
    if (JsonScanner<TokenizerSax>(text, sax).scan()) return root;
    lists = TokenizerLists();
  }
  Json root;
  TokenizerSax sax(root, lists, path);
  Json::sax_parse(text, &sax);
  return root;
}

}  // namespace trainer::data
