// The files a record data set reads (chat: JSONL, Parquet and Arrow stream files; preference:
// JSONL): data.files and data.val_files patterns relative to data.root, or data.root itself (a
// file, or a folder of them as the Hugging Face Hub and datasets' save_to_disk lay them out),
// each problem a DataConfigError naming its key.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainer::data {

// `name` under `root` (a name that is absolute, or no root, stays as it is).
std::string join_path(const std::string& root, const std::string& name);

// Why `path`, which is not a regular file, cannot be read: missing ("no such file", or "no such
// file or folder" where a folder would do), a folder where a file is wanted, or a FIFO or device.
std::string not_a_file(const std::string& path, bool folder_ok);

// The files of a pattern of data.files or data.val_files (`key`), relative to data.root: its
// brace expansion (data/tokens/shards.h), each name with a wildcard (*, ?, [...]) the files it
// matches in byte order (none: an error).
std::vector<std::string> pattern_files(const std::string& root, const std::string& pattern,
                                       const std::string& key);

// The training files: `files` (data.files), else data.root `root`: a file, or a folder's files
// named with one of `extensions` (".jsonl"), but `val`, in name order. A folder with none reads
// the training split of a data set folder: the Hub's (data/train-00000-of-00003.parquet,
// data/train.jsonl: data/ files named train*) or save_to_disk's of a DatasetDict
// (dataset_dict.json beside train/data-00000-of-00001.arrow: train/'s files). `what` names the
// records in the message for an unset root ("conversations").
std::vector<std::string> train_files(const std::string& root, const std::string& files,
                                     const std::vector<std::string>& val, const std::string& what,
                                     const std::vector<std::string>& extensions = {".jsonl"});

// Whether record `number` (a line's, 1-based; a row's counts as line row + 1) of file `file`
// validates when no file is set aside for validation: chance `fraction`, drawn from (seed, file,
// number), so a record's split follows from the run's seed alone.
bool drawn_for_validation(uint64_t seed, uint64_t file, uint64_t number, double fraction);

// Whether `path` is read as rows (a .parquet or .arrow file: data/formats/arrow_rows.h) rather
// than as JSON Lines.
bool is_rows_file(const std::string& path);

// The folder a tokenizer path names (itself, or a file's folder), for its tokenizer_config.json.
std::string tokenizer_folder(const std::string& path);

}  // namespace trainer::data
