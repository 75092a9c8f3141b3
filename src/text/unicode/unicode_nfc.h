// Unicode Normalization Form C, as the NFC normalizer of Hugging Face's `tokenizers` applies it
// (its tables are of an older Unicode version than the character classes': code points it does
// not know stay as they are). Torch-free.
#pragma once

#include <string>
#include <string_view>

namespace trainer {

// Whether `s` is in NFC as far as a quick check tells: every code point stands unchanged on its
// own (no combining class, never the second part of a composition, not changed by NFC). True
// means nfc(s) == s; false means nfc(s) may differ.
bool nfc_quick_check(std::string_view s);

// `s` in Normalization Form C: canonical decomposition, canonical ordering of combining marks,
// canonical composition. Malformed UTF-8 bytes stay as they are (each a boundary).
std::string nfc(std::string_view s);

}  // namespace trainer
