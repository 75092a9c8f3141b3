#include "text/tokens/tokenize.h"

#include <atomic>
#include <thread>

#include "text/error.h"
#include "text/files.h"
#include "text/tokens/token_sidecar.h"
#include "util/fileio.h"

namespace trainer::data {
namespace {

constexpr size_t kChunkBytes = size_t{1} << 20;
constexpr size_t kMaxCachedPieces = size_t{1} << 20;  // then the thread's cache starts afresh
constexpr size_t kBatchBytes = size_t{64} << 20;      // text read before encoding

bool printable_ascii(char c) {
  return c > ' ' && c < 0x7f;
}

// Passes `ids` to `sink` as little-endian integers of `width` bytes, through `bytes`.
void write_ids(const std::vector<int32_t>& ids, int width, std::vector<uint8_t>& bytes,
               const ByteSink& sink) {
  bytes.resize(ids.size() * static_cast<size_t>(width));
  for (size_t i = 0; i < ids.size(); ++i) {
    for (int b = 0; b < width; ++b) {
      bytes[i * static_cast<size_t>(width) + static_cast<size_t>(b)] =
          static_cast<uint8_t>(static_cast<uint32_t>(ids[i]) >> (8 * b));
    }
  }
  sink(bytes.data(), bytes.size());
}

}  // namespace

std::vector<size_t> chunk_ends(const std::string& text, size_t chunk) {
  std::vector<size_t> ends;
  size_t from = 0;
  while (text.size() - from > chunk) {
    // The first newline after `from + chunk` with printable ASCII on both sides.
    size_t at = text.find('\n', from + chunk);
    while (at != std::string::npos &&
           !(at > 0 && at + 1 < text.size() && printable_ascii(text[at - 1]) &&
             printable_ascii(text[at + 1]))) {
      at = text.find('\n', at + 1);
    }
    if (at == std::string::npos) break;
    ends.push_back(at + 1);
    from = at + 1;
  }
  ends.push_back(text.size());
  return ends;
}

ParallelEncoder::ParallelEncoder(const BpeTokenizer& tokenizer, int threads, bool allow_special)
    : tokenizer_(tokenizer),
      threads_(std::max(threads, 1)),
      allow_special_(allow_special),
      caches_(static_cast<size_t>(threads_)) {}

std::vector<std::vector<int32_t>> ParallelEncoder::encode(const std::vector<std::string>& texts) {
  struct Chunk {
    size_t text, begin, end;
  };
  std::vector<Chunk> chunks;
  for (size_t t = 0; t < texts.size(); ++t) {
    size_t begin = 0;
    const auto ends = tokenizer_.cuts_at_newlines() ? chunk_ends(texts[t], kChunkBytes)
                                                    : std::vector<size_t>{texts[t].size()};
    for (size_t end : ends) {
      chunks.push_back({t, begin, end});
      begin = end;
    }
  }
  std::vector<std::vector<int32_t>> parts(chunks.size());
  std::atomic<size_t> next{0};
  const auto work = [&](BpeTokenizer::PieceCache& cache) {
    for (size_t c = next++; c < chunks.size(); c = next++) {
      const auto& k = chunks[c];
      if (cache.size() > kMaxCachedPieces) cache.clear();
      const std::string_view text =
          std::string_view(texts[k.text]).substr(k.begin, k.end - k.begin);
      tokenizer_.encode_into(text, allow_special_, &cache, parts[c]);
    }
  };
  const int helpers = static_cast<int>(std::min<size_t>(threads_, chunks.size())) - 1;
  std::vector<std::thread> pool;
  for (int t = 0; t < helpers; ++t) pool.emplace_back(work, std::ref(caches_[t + 1]));
  work(caches_[0]);
  for (auto& t : pool) t.join();
  std::vector<std::vector<int32_t>> out(texts.size());
  for (size_t c = 0; c < chunks.size(); ++c) {
    auto& ids = out[chunks[c].text];
    ids.insert(ids.end(), parts[c].begin(), parts[c].end());
  }
  return out;
}

TokenizeResult tokenize_files(const BpeTokenizer& tokenizer, const std::vector<std::string>& files,
                              const std::string& out, int width, int threads, bool allow_special) {
  const int64_t separator = tokenizer.end_of_text();
  if (files.size() > 1 && separator < 0) {
    throw DataError(tokenizer.source() +
                    ": the tokenizer has no <|endoftext|>, <|end_of_text|> or eos token to put "
                    "between documents");
  }
  TokenizeResult result;
  result.width = width;
  TokenSidecar sidecar;
  describe_tokenizer(tokenizer, sidecar);
  ParallelEncoder encoder(tokenizer, threads, allow_special);
  write_atomically(out, [&](const ByteSink& sink) {
    std::vector<uint8_t> bytes;
    for (size_t f = 0; f < files.size();) {
      std::vector<std::string> batch;  // documents f.. up to kBatchBytes of text
      size_t held = 0;
      for (; f < files.size() && (batch.empty() || held < kBatchBytes); ++f) {
        const auto bytes = read_file(files[f]);
        batch.emplace_back(bytes.begin(), bytes.end());
        held += batch.back().size();
      }
      const auto encoded = encoder.encode(batch);
      for (size_t d = 0; d < batch.size(); ++d) {
        if (result.documents > 0) write_ids({static_cast<int32_t>(separator)}, width, bytes, sink);
        write_ids(encoded[d], width, bytes, sink);
        result.tokens += static_cast<int64_t>(encoded[d].size()) + (result.documents > 0 ? 1 : 0);
        result.bytes += static_cast<int64_t>(batch[d].size());
        ++result.documents;
      }
    }
  });
  sidecar.dtype = width == 4 ? "uint32" : "uint16";
  sidecar.tokens = result.tokens;
  sidecar.vocab_size = tokenizer.vocab_size();
  sidecar.documents = result.documents;
  sidecar.end_of_text = separator;
  write_token_sidecar(out, sidecar);
  result.sidecar = token_sidecar_path(out);
  return result;
}

}  // namespace trainer::data
