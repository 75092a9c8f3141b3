#include "text/tokenizer/hf_added_tokens.h"

#include <algorithm>

#include "text/unicode/unicode.h"

namespace trainer::data {
namespace {

// Where the run of whitespace that ends text[0, end) begins (tokenizers' `\s*$`).
size_t whitespace_before(std::string_view text, size_t end) {
  size_t begin = end;
  while (begin > 0) {
    size_t k = begin - 1;  // back to the start of the previous code point
    while (k > 0 && (static_cast<unsigned char>(text[k]) & 0xC0) == 0x80 && begin - k < 4) --k;
    size_t n = 0;
    const char32_t c = decode_utf8(text.data(), text.size(), k, n);
    if (k + n != begin || !is_whitespace(c)) break;
    begin = k;
  }
  return begin;
}

// The length of the run of whitespace that starts text[begin, ...) (tokenizers' `^\s*`).
size_t whitespace_after(std::string_view text, size_t begin) {
  size_t end = begin;
  while (end < text.size()) {
    size_t n = 0;
    if (!is_whitespace(decode_utf8(text.data(), text.size(), end, n))) break;
    end += n;
  }
  return end - begin;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(const std::vector<Pattern>& patterns) {
  for (const auto& p : patterns) {
    if (p.text.empty()) continue;
    int32_t node = 0;
    for (const char ch : p.text) {
      const auto b = static_cast<unsigned char>(ch);
      auto& next = nodes_[static_cast<size_t>(node)].next;
      const auto it =
          std::find_if(next.begin(), next.end(), [&](const auto& e) { return e.first == b; });
      if (it != next.end()) {
        node = it->second;
      } else {
        const auto created = static_cast<int32_t>(nodes_.size());
        nodes_[static_cast<size_t>(node)].next.emplace_back(b, created);
        nodes_.emplace_back();
        node = created;
      }
    }
    auto& end = nodes_[static_cast<size_t>(node)];
    if (end.pattern >= 0) continue;  // the same text again: the first one is found
    end.pattern = static_cast<int32_t>(patterns_.size());
    patterns_.push_back(p);
    first_byte_[static_cast<unsigned char>(p.text[0])] = true;
    ordinary_ = ordinary_ || !p.special;
  }
}

int32_t AddedTokenMatcher::longest_at(std::string_view text, size_t i, size_t& length) const {
  int32_t node = 0, found = -1;
  for (size_t k = i; k < text.size(); ++k) {
    const auto b = static_cast<unsigned char>(text[k]);
    const auto& next = nodes_[static_cast<size_t>(node)].next;
    const auto it =
        std::find_if(next.begin(), next.end(), [&](const auto& e) { return e.first == b; });
    if (it == next.end()) break;
    node = it->second;
    if (nodes_[static_cast<size_t>(node)].pattern >= 0) {
      found = nodes_[static_cast<size_t>(node)].pattern;
      length = k + 1 - i;
    }
  }
  return found;
}

void AddedTokenMatcher::split(std::string_view text, bool allow_special,
                              std::vector<Split>& out) const {
  out.clear();
  size_t done = 0;  // the end of the last part (tokenizers' start_offset)
  for (size_t i = 0; i < text.size();) {
    size_t length = 0;
    const int32_t found =
        first_byte_[static_cast<unsigned char>(text[i])] ? longest_at(text, i, length) : -1;
    if (found < 0) {
      ++i;
      continue;
    }
    const Pattern& p = patterns_[static_cast<size_t>(found)];
    size_t start = i, stop = i + length;
    i = stop;  // the search goes on after the match itself
    if (p.special && !allow_special) continue;
    if (p.lstrip) start = std::max(whitespace_before(text, start), done);
    if (p.rstrip) stop += whitespace_after(text, stop);
    if (done < start) out.push_back({done, start, -1});
    out.push_back({start, stop, p.id});
    done = stop;
  }
  if (done != text.size()) out.push_back({done, text.size(), -1});
}

}  // namespace trainer::data
