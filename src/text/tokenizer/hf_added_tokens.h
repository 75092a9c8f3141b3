// The added tokens of a tokenizer found in text as tokenizers' AddedVocabulary finds them: an
// Aho-Corasick automaton's leftmost-longest matches, lstrip taking the whitespace before a token
// and rstrip the whitespace after it (the search going on after the token itself), special tokens
// optionally left in the text. Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace trainer::data {

class AddedTokenMatcher {
 public:
  // A token this matcher finds: its text as matched (normalized where the token is), its id and
  // flags.
  struct Pattern {
    std::string text;
    int64_t id = 0;
    bool special = false, lstrip = false, rstrip = false;
  };
  // A part of the text: an added token (id >= 0) or text to encode (id -1), [begin, end).
  struct Split {
    size_t begin, end;
    int64_t id;
  };

  AddedTokenMatcher() = default;
  // `patterns` in tokenizers' order (special tokens first); empty texts are left out.
  explicit AddedTokenMatcher(const std::vector<Pattern>& patterns);

  // Whether there is nothing to find in text when special tokens are left in it.
  bool empty(bool allow_special) const { return allow_special ? nodes_.size() <= 1 : !ordinary_; }

  // Replaces `out` with the parts of `text`, in order (a token's part may overlap the previous
  // one's where rstrip took whitespace the search then matched again, as in tokenizers). With
  // allow_special false, special tokens are matched but left in the text.
  void split(std::string_view text, bool allow_special, std::vector<Split>& out) const;

 private:
  struct Node {
    int32_t pattern = -1;  // the pattern ending here
    std::vector<std::pair<unsigned char, int32_t>> next;
  };
  // The longest pattern starting at text[i] (its index, and its length in `length`); -1 if none.
  int32_t longest_at(std::string_view text, size_t i, size_t& length) const;

  std::vector<Node> nodes_{1};  // nodes_[0]: the root
  std::vector<Pattern> patterns_;
  bool first_byte_[256] = {};
  bool ordinary_ = false;  // whether a pattern is not special
};

}  // namespace trainer::data
