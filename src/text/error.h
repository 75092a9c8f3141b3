// The errors of the text and data readers: an unreadable or corrupt file (DataError; a
// tokenizer's files: TokenizerError), or a setting they reject (DataConfigError, which the engine
// reports at the key's YAML location). Torch-free: the tokenizer, the chat templates and the data
// sets throw them alike.
#pragma once

#include <stdexcept>
#include <string>

namespace trainer::data {

// Thrown for unreadable, truncated or corrupt data files; the message names the file and the
// problem.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Thrown for settings the data rejects (a missing data.root, data.mean of the wrong length, ...);
// the engine reports it as a config error at the key's YAML location.
class DataConfigError : public std::invalid_argument {
 public:
  DataConfigError(std::string key, const std::string& message)
      : std::invalid_argument(key + ": " + message), key_(std::move(key)), message_(message) {}
  // The config key the problem is about, e.g. "data.root".
  const std::string& key() const { return key_; }
  // The message without the key.
  const std::string& message() const { return message_; }

 private:
  std::string key_;
  std::string message_;
};

// Thrown for a tokenizer's files that cannot be used (tokenizer.json, tokenizer_config.json,
// GPT-2's encoder.json and vocab.bpe); the message names the file and the field.
class TokenizerError : public DataError {
 public:
  using DataError::DataError;
};

}  // namespace trainer::data
