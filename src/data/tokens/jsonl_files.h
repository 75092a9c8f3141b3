// The JSONL files a record data set reads (chat, preference): data.files and data.val_files
// patterns relative to data.root, or data.root itself (a file, or a folder's .jsonl files), each
// problem a DataConfigError naming its key.
#pragma once

#include <string>
#include <vector>

namespace trainer::data {

// `name` under `root` (a name that is absolute, or no root, stays as it is).
std::string join_path(const std::string& root, const std::string& name);

// Why `path`, which is not a regular file, cannot be read: missing ("no such file", or "no such
// file or folder" where a folder would do), a folder where a file is wanted, or a FIFO or device.
std::string not_a_file(const std::string& path, bool folder_ok);

// The files of a pattern of data.files or data.val_files (`key`), relative to data.root.
std::vector<std::string> pattern_files(const std::string& root, const std::string& pattern,
                                       const std::string& key);

// The training files: `files` (data.files), else data.root `root`: a file, or a folder's .jsonl
// files but `val`. `what` names the records in the message for an unset root ("conversations").
std::vector<std::string> train_files(const std::string& root, const std::string& files,
                                     const std::vector<std::string>& val, const std::string& what);

// The folder a tokenizer path names (itself, or a file's folder), for its tokenizer_config.json.
std::string tokenizer_folder(const std::string& path);

}  // namespace trainer::data
