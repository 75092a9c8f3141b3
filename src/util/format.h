// String formatting usable next to LibTorch (whose bundled fmt clashes with the system's).
//
// 64-bit integers go through <cinttypes>' PRId64: strprintf("step %" PRId64, step).
#pragma once

#include <cinttypes>
#include <cstdint>
#include <string>

namespace trainer {

// printf-style formatting into a std::string.
std::string strprintf(const char* format, ...) __attribute__((format(printf, 1, 2)));

// The shortest decimal text that reads back as exactly `v` ("0.1", "1e-8", "3e+20"); YAML's
// ".nan", ".inf" and "-.inf" for the non-finite values.
std::string format_number(double v);

// The bytes of a size written as a number and a unit ("5GB", "500MB", "141GiB", "1024"), or a
// negative number when `text` is not one. Units, in any case: none or B (bytes), KB MB GB TB
// (powers of 1000), KiB MiB GiB TiB (powers of 1024).
double parse_size(const std::string& text);

// Bytes in the largest binary unit that keeps the figure at 1 or more: "512 B", "3.2 MiB",
// "139.8 GiB" (a small model's memory does not round to "0.0 GiB").
std::string bytes_text(int64_t bytes);

}  // namespace trainer
