#include "text/tokenizer/hf_bpe.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <queue>

namespace trainer::data {
namespace {

// Pieces up to this many bytes merge by scanning all pairs for each merge (fast when short);
// longer ones through a priority queue, as tokenizers does.
constexpr size_t kShortPiece = 128;

}  // namespace

void BytesTable::reserve(size_t count) {
  size_t capacity = 16;
  while (capacity < count * 2) capacity *= 2;
  if (capacity <= slots_.size()) return;
  std::vector<Slot> old(capacity);
  old.swap(slots_);
  for (const Slot& s : old) {
    if (s.check != 0) place(s, hash_bytes(keys_.data() + s.offset, s.length));
  }
}

void BytesTable::place(const Slot& slot, uint64_t hash) {
  const size_t mask = slots_.size() - 1;
  size_t i = first_slot(hash, mask);
  while (slots_[i].check != 0) i = (i + 1) & mask;
  slots_[i] = slot;
}

void BytesTable::insert(std::string_view key, uint64_t hash, int32_t id) {
  if ((used_ + 1) * 2 > slots_.size()) reserve(std::max<size_t>(used_ + 1, slots_.size()));
  if (find(key, hash) >= 0) return;
  place(
      {check_of(hash), id, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(key.size())},
      hash);
  keys_.append(key);
  ++used_;
}

void MergeTable::build(const std::vector<std::pair<int32_t, int32_t>>& pairs,
                       const std::vector<int32_t>& merged) {
  size_t capacity = 16;
  int bits = 4;
  while (capacity < pairs.size() * 2) capacity *= 2, ++bits;
  slots_.assign(capacity, Slot{});
  mask_ = capacity - 1;
  shift_ = 64 - bits;
  for (size_t r = 0; r < pairs.size(); ++r) {
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(pairs[r].first)) << 32) |
                         static_cast<uint32_t>(pairs[r].second);
    for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.key == kEmpty || s.key == key) {  // a pair listed again: its last rank (tokenizers)
        s.key = key;
        s.merge = {static_cast<int32_t>(r), merged[r]};
        break;
      }
    }
  }
}

void MergeTable::merge(std::string_view piece, const int32_t* byte_ids,
                       std::vector<int32_t>& out) const {
  if (piece.size() <= kShortPiece) {
    merge_short(piece, byte_ids, out);
  } else {
    merge_long(piece, byte_ids, out);
  }
}

void MergeTable::merge_short(std::string_view piece, const int32_t* byte_ids,
                             std::vector<int32_t>& out) const {
  const size_t n = piece.size();
  int32_t ids[kShortPiece];
  Merge pairs[kShortPiece];  // pairs[k]: the merge of ids[k] and ids[k + 1]
  for (size_t k = 0; k < n; ++k) ids[k] = byte_ids[static_cast<unsigned char>(piece[k])];
  for (size_t k = 0; k + 1 < n; ++k) pairs[k] = find(ids[k], ids[k + 1]);
  size_t count = n;
  while (count > 1) {
    size_t best = count;
    int32_t best_rank = INT32_MAX;
    for (size_t k = 0; k + 1 < count; ++k) {
      if (pairs[k].rank >= 0 && pairs[k].rank < best_rank) {
        best_rank = pairs[k].rank;
        best = k;
      }
    }
    if (best == count) break;
    ids[best] = pairs[best].id;
    for (size_t k = best + 1; k + 1 < count; ++k) {
      ids[k] = ids[k + 1];
      pairs[k] = pairs[k + 1];
    }
    --count;
    if (best > 0) pairs[best - 1] = find(ids[best - 1], ids[best]);
    if (best + 1 < count) pairs[best] = find(ids[best], ids[best + 1]);
  }
  out.insert(out.end(), ids, ids + count);
}

// tokenizers' Word::merge_all: a min-queue of (rank, position) over the pairs, entries whose
// pair has changed since skipped.
void MergeTable::merge_long(std::string_view piece, const int32_t* byte_ids,
                            std::vector<int32_t>& out) const {
  const size_t n = piece.size();
  struct Symbol {
    int32_t id;
    int64_t prev, next;
    bool alive;
  };
  std::vector<Symbol> symbols(n);
  for (size_t k = 0; k < n; ++k) {
    symbols[k] = {byte_ids[static_cast<unsigned char>(piece[k])], static_cast<int64_t>(k) - 1,
                  k + 1 < n ? static_cast<int64_t>(k + 1) : -1, true};
  }
  struct Entry {
    int32_t rank;
    int64_t pos;
    int32_t id;
    bool operator>(const Entry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue;
  const auto push = [&](int64_t pos) {
    if (pos < 0 || symbols[static_cast<size_t>(pos)].next < 0) return;
    const Merge m = find(symbols[static_cast<size_t>(pos)].id,
                         symbols[static_cast<size_t>(symbols[static_cast<size_t>(pos)].next)].id);
    if (m.rank >= 0) queue.push({m.rank, pos, m.id});
  };
  for (size_t k = 0; k + 1 < n; ++k) push(static_cast<int64_t>(k));
  while (!queue.empty()) {
    const Entry top = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<size_t>(top.pos)];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[static_cast<size_t>(left.next)];
    if (find(left.id, right.id).id != top.id) continue;  // the pair changed since
    left.id = top.id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = top.pos;
    push(left.prev);
    push(top.pos);
  }
  for (int64_t k = 0; k >= 0; k = symbols[static_cast<size_t>(k)].next) {
    out.push_back(symbols[static_cast<size_t>(k)].id);
  }
}

}  // namespace trainer::data
