#include "util/strings.h"

#include <algorithm>
#include <limits>

namespace trainer {
namespace {

std::string last_component(const std::string& path) {
  const auto pos = path.rfind('.');
  return pos == std::string::npos ? path : path.substr(pos + 1);
}

// The most edits a suggestion may be away from `word`: about a third of its length, 1 to 3.
size_t suggestion_limit(const std::string& word) {
  return std::max<size_t>(1, std::min<size_t>(3, word.size() / 3 + 1));
}

}  // namespace

std::string join(const std::vector<std::string>& parts, const std::string& separator) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += separator;
    out += parts[i];
  }
  return out;
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> out;
  if (text.empty()) return out;
  size_t start = 0;
  for (size_t at = text.find(separator); at != std::string::npos;
       at = text.find(separator, start)) {
    out.push_back(text.substr(start, at - start));
    start = at + 1;
  }
  out.push_back(text.substr(start));
  return out;
}

std::string trim(const std::string& text) {
  const size_t first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

std::string first_line(const std::string& text) {
  return text.substr(0, text.find('\n'));
}

size_t edit_distance(const std::string& a, const std::string& b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[n][m];
}

std::string closest(const std::string& word, const std::vector<std::string>& candidates) {
  const std::string last = last_component(word);
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const auto& c : candidates) {
    size_t d = edit_distance(word, c);
    if (c.find('.') != std::string::npos || word.find('.') != std::string::npos) {
      d = std::min(d, edit_distance(last, last_component(c)) + 1);
    }
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  if (best.empty() || best_d > suggestion_limit(last)) return "";
  return best;
}

}  // namespace trainer
