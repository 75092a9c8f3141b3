// Library messages made readable: the source paths a library puts before its words.
#pragma once

#include <cctype>
#include <string>

namespace trainer {

// `text` without the bracketed source locations libraries put in their messages
// ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:538] Read error ..." -> "Read error
// ..."): each "[PATH:LINE] " whose PATH holds a '/' and LINE is digits. Other brackets stay
// ("[127.0.0.1]:29500").
inline std::string without_source_paths(const std::string& text) {
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    const size_t close = text[i] == '[' ? text.find(']', i) : std::string::npos;
    if (close != std::string::npos) {
      const std::string inside = text.substr(i + 1, close - i - 1);
      const size_t colon = inside.rfind(':');
      bool digits = colon != std::string::npos && colon + 1 < inside.size();
      for (size_t k = colon + 1; digits && k < inside.size(); ++k)
        digits = std::isdigit(static_cast<unsigned char>(inside[k])) != 0;
      if (digits && inside.find('/') < colon && inside.find(' ') == std::string::npos) {
        i = close + 1;
        while (i < text.size() && text[i] == ' ') ++i;
        continue;
      }
    }
    out += text[i++];
  }
  return out;
}

}  // namespace trainer
