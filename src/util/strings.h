// Small text helpers shared by the configuration, the doctor and the engine. Torch-free.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace trainer {

// `parts` separated by `separator`.
std::string join(const std::vector<std::string>& parts, const std::string& separator);

// The pieces of `text` between the `separator`s; empty for an empty text.
std::vector<std::string> split(const std::string& text, char separator);

// `text` without leading and trailing spaces and tabs.
std::string trim(const std::string& text);

// The text before the first newline of `text`.
std::string first_line(const std::string& text);

// Optimal string alignment distance: Levenshtein plus adjacent transpositions.
size_t edit_distance(const std::string& a, const std::string& b);

// The candidate closest to `word`, or "" when none is close enough to be a likely typo. Dotted key
// paths are also compared by their last component, so that a right name in the wrong section
// ("lr" for "optim.lr") counts as one edit.
std::string closest(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace trainer
