// The identity of a model.pretrained base by its contents: what a LoRA checkpoint records of the
// frozen base it was trained on (meta["lora"]["base"]), so that its adapters never land on
// another base, wherever the base lies.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace trainer::checkpoint {

// Reads bytes [offset, offset + n) of a file or tensor into `dst`.
using ByteReader = std::function<void(uint64_t offset, uint64_t n, uint8_t* dst)>;

// Appends `text` and a terminating 0 to `out`.
void append_identity_text(std::vector<uint8_t>& out, const std::string& text);

// Appends bytes [0, size) that `read` reads to `out`: all of them when they are few (at most
// 64 x 64 KiB), else 64 chunks of 64 KiB spread evenly over them, the first and the last
// included, so that two different weights differ in the sample.
void append_identity_sample(std::vector<uint8_t>& out, uint64_t size, const ByteReader& read);

// The files the identity of `pretrained` hashes, by path: of a folder, config.json and the weight
// files that loading reads, in transformers' precedence (hf_weight_files: model.safetensors,
// else the index and the shards it lists; an unlisted .safetensors beside them is not read);
// else the one weights file.
std::vector<std::string> pretrained_identity_files(const std::string& pretrained);

// The identity of model.pretrained `pretrained` (not empty): an xxHash64 (hex) of each file of
// pretrained_identity_files' name within the folder, size and sampled bytes (a weights file
// alone: its size and bytes, not its name). The path of the folder or file is not part of it:
// a copy elsewhere is the same base. Throws std::runtime_error naming a file that cannot be read.
std::string pretrained_identity(const std::string& pretrained);

// Whether `recorded` (a checkpoint's meta["lora"]["base"]) is the identity of `pretrained`: its
// pretrained_identity, or, for a weights file, the identity checkpoints written before the name
// was left out record (the file's name hashed too), for the same file under the same name.
// Throws what pretrained_identity throws.
bool is_pretrained_identity(const std::string& pretrained, const std::string& recorded);

}  // namespace trainer::checkpoint
