// The BPE model of byte-level tokenizers: hash tables of the merges and of the vocabulary's
// bytes, and the merging of one piece as tokenizers' BPE does it (the pair of lowest merge rank
// first, the leftmost of equal ones; a whole piece in the vocabulary is one token with
// ignore_merges). Torch-free.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace trainer::data {

// A 64-bit hash of bytes (never 0). The bytes past the last whole 8 are read as whole words, not
// copied byte by byte (a copy of variable length stalls the load of the word after it).
inline uint64_t hash_bytes(const char* p, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ULL ^ (n * 0xFF51AFD7ED558CCDULL);
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * 0xBF58476D1CE4E5B9ULL;
    h ^= h >> 31;
  }
  if (n > 0) {  // the last 1 to 7 bytes, read whole (two words that may overlap, or three bytes)
    uint64_t w = 0;
    if (n >= 4) {
      uint32_t first, last;
      std::memcpy(&first, p, 4);
      std::memcpy(&last, p + n - 4, 4);
      w = (static_cast<uint64_t>(first) << 32) | last;
    } else {
      const auto byte = [p](size_t i) { return static_cast<uint64_t>(static_cast<uint8_t>(p[i])); };
      w = (byte(0) << 16) | (byte(n / 2) << 8) | byte(n - 1);
    }
    h = (h ^ w) * 0x94D049BB133111EBULL;
  }
  h ^= h >> 32;
  h *= 0xD6E8FEB86659FD93ULL;
  h ^= h >> 32;
  return h | 1;
}

// The first slot to probe for `hash` in a table of mask + 1 slots (a power of two). The hash's
// lowest bit is always set: slots are taken from the bits above it.
inline size_t first_slot(uint64_t hash, size_t mask) {
  return static_cast<size_t>(hash >> 1) & mask;
}

// Byte strings to ids, open addressing: 16-byte slots (four to a cache line), the keys in one
// buffer.
class BytesTable {
 public:
  void reserve(size_t count);
  // Adds `key` (hash = hash_bytes(key)) with `id` (>= 0); the first insert of a key wins.
  void insert(std::string_view key, uint64_t hash, int32_t id);
  void insert(std::string_view key, int32_t id) {
    insert(key, hash_bytes(key.data(), key.size()), id);
  }
  // The id of `key` (hash = hash_bytes(key)); -1 when absent.
  int32_t find(std::string_view key, uint64_t hash) const {
    if (slots_.empty()) return -1;
    const auto check = check_of(hash);
    const size_t mask = slots_.size() - 1;
    for (size_t i = first_slot(hash, mask);; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.check == 0) return -1;
      if (s.check == check && s.length == key.size() &&
          std::memcmp(keys_.data() + s.offset, key.data(), key.size()) == 0) {
        return s.id;
      }
    }
  }
  // Starts loading the slot a find of `hash` looks at first (for finds of many keys).
  void prefetch(uint64_t hash) const {
    if (!slots_.empty()) __builtin_prefetch(&slots_[first_slot(hash, slots_.size() - 1)]);
  }
  // The keys held.
  size_t size() const { return used_; }

 private:
  struct Slot {
    uint32_t check = 0;  // the hash's upper half, never 0; 0: empty
    int32_t id = -1;
    uint32_t offset = 0, length = 0;
  };
  static uint32_t check_of(uint64_t hash) { return static_cast<uint32_t>(hash >> 32) | 1u; }
  void place(const Slot& slot, uint64_t hash);
  std::vector<Slot> slots_;
  std::string keys_;
  size_t used_ = 0;
};

// BPE merges: (left id, right id) -> (rank, merged id).
class MergeTable {
 public:
  struct Merge {
    int32_t rank = -1;  // -1: no merge
    int32_t id = -1;
  };
  void build(const std::vector<std::pair<int32_t, int32_t>>& pairs,
             const std::vector<int32_t>& merged);
  Merge find(int32_t left, int32_t right) const {
    const uint64_t key =
        (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
    for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return s.merge;
      if (s.key == kEmpty) return {};
    }
  }

  // Appends the ids of `piece` (at least 2 bytes), its bytes' tokens (`byte_ids`) merged.
  void merge(std::string_view piece, const int32_t* byte_ids, std::vector<int32_t>& out) const;

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  struct Slot {
    uint64_t key = kEmpty;
    Merge merge;
  };
  size_t slot_of(uint64_t key) const {
    return static_cast<size_t>((key * 0x9E3779B97F4A7C15ULL) >> shift_);
  }
  void merge_short(std::string_view piece, const int32_t* byte_ids,
                   std::vector<int32_t>& out) const;
  void merge_long(std::string_view piece, const int32_t* byte_ids, std::vector<int32_t>& out) const;

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int shift_ = 64;
};

}  // namespace trainer::data
