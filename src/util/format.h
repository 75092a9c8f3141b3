// String formatting usable next to LibTorch (whose bundled fmt clashes with the system's).
#pragma once

#include <string>

namespace trainer {

// printf-style formatting into a std::string.
std::string strprintf(const char* format, ...) __attribute__((format(printf, 1, 2)));

}  // namespace trainer
