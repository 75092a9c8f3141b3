// String formatting usable next to LibTorch (whose bundled fmt clashes with the system's).
//
// 64-bit integers go through <cinttypes>' PRId64: strprintf("step %" PRId64, step).
#pragma once

#include <cinttypes>
#include <string>

namespace trainer {

// printf-style formatting into a std::string.
std::string strprintf(const char* format, ...) __attribute__((format(printf, 1, 2)));

// The shortest decimal text that reads back as exactly `v` ("0.1", "1e-8", "3e+20"); YAML's
// ".nan", ".inf" and "-.inf" for the non-finite values.
std::string format_number(double v);

}  // namespace trainer
