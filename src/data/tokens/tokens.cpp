// The `tokens` dataset for language models: a token stream, either a flat file of little-endian
// uint16 or uint32 token ids (nanoGPT's train.bin/val.bin, trainer tokenize's output) or the raw
// bytes of a text file (vocabulary 256). The description trainer tokenize writes beside a token
// file (FILE.json, text/tokens/token_sidecar.h) gives its width and vocabulary, and the file is
// checked against it. data.root is such a file, whose last data.val_fraction is held out for
// validation, or a folder with train.bin and val.bin. Files are read with pread, so corpora larger
// than memory work.
//
// A sample is a window of seq_len + 1 tokens: inputs the first seq_len, targets the last seq_len.
// An epoch has (tokens - 1) / seq_len samples. Training windows start at random offsets drawn
// from (seed, epoch, index); validation windows tile the split in order. A mask file beside a token
// file (train.mask beside train.bin: one byte a token, 0 where it does not train, as
// scripts/render_chat.py writes) makes those targets kIgnoreTarget.
#include <fcntl.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "data/dataset.h"
#include "text/files.h"
#include "text/tokens/token_sidecar.h"
#include "util/format.h"
#include "util/log.h"
#include "util/random.h"

namespace trainer::data {
namespace {

// A token file read with pread(2): a file that shrinks while training is a DataError naming it,
// not a fault in a memory map. The page cache keeps what is read often, so corpora larger than
// memory work.
class TokenFile {
 public:
  explicit TokenFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw DataError(path + ": cannot open: " + std::strerror(errno));
    struct stat st;
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd_);
      throw DataError(path + ": not a regular file");
    }
    size_ = static_cast<size_t>(st.st_size);
  }
  ~TokenFile() { ::close(fd_); }
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  // Bytes [offset, offset + n) into `out`; thread-safe.
  void read(size_t offset, size_t n, uint8_t* out) const {
    size_t done = 0;
    while (done < n) {
      const ssize_t got = ::pread(fd_, out + done, n - done, static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        throw DataError(path_ + (got < 0 ? ": read failed: " + std::string(std::strerror(errno))
                                         : ": changed size during training (it had " +
                                               std::to_string(size_) + " bytes); restore it"));
      }
      done += static_cast<size_t>(got);
    }
  }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  size_t size_ = 0;
};

// Tokens [begin, end) of a file, 1, 2 or 4 bytes each (little-endian).
struct TokenRange {
  std::shared_ptr<const TokenFile> file;
  int64_t width = 1;  // bytes per token
  int64_t begin = 0, end = 0;
  // One byte a token, nonzero where it trains as a target (a .mask file beside the token file,
  // as scripts/render_chat.py writes); null: every token trains.
  std::shared_ptr<const TokenFile> mask;
  // What trainer tokenize wrote beside the file (FILE.json), if there is such a description.
  std::optional<TokenSidecar> sidecar;

  int64_t size() const { return end - begin; }
  // Tokens [first, first + n) of the range into `out`.
  void read(int64_t first, int64_t n, int64_t* out) const {
    std::vector<uint8_t> bytes(static_cast<size_t>(n * width));
    file->read(static_cast<size_t>((begin + first) * width), bytes.size(), bytes.data());
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* p = bytes.data() + i * width;
      uint32_t v = 0;
      for (int64_t b = 0; b < width; ++b) v |= static_cast<uint32_t>(p[b]) << (8 * b);
      out[i] = static_cast<int64_t>(v);
    }
  }
  // Mask bytes [first, first + n) of the range into `out`.
  void read_mask(int64_t first, int64_t n, uint8_t* out) const {
    mask->read(static_cast<size_t>(begin + first), static_cast<size_t>(n), out);
  }
  // The tokens that train (all without a mask).
  int64_t trained() const {
    if (!mask) return size();
    constexpr int64_t kChunk = int64_t{1} << 20;
    std::vector<uint8_t> chunk(kChunk);
    int64_t n = 0;
    for (int64_t i = 0; i < size(); i += kChunk) {
      const int64_t m = std::min(kChunk, size() - i);
      read_mask(i, m, chunk.data());
      n += m - std::count(chunk.begin(), chunk.begin() + m, 0);
    }
    return n;
  }
  int64_t max_token() const {
    constexpr int64_t kChunk = int64_t{1} << 20;  // tokens per read
    std::vector<int64_t> chunk(kChunk);
    int64_t m = 0;
    for (int64_t i = 0; i < size(); i += kChunk) {
      const int64_t n = std::min(kChunk, size() - i);
      read(i, n, chunk.data());
      m = std::max(m, *std::max_element(chunk.begin(), chunk.begin() + n));
    }
    return m;
  }
};

class Tokens final : public Dataset {
 public:
  Tokens(TokenRange tokens, int64_t seq_len, bool random_windows)
      : tokens_(std::move(tokens)), seq_len_(seq_len), random_(random_windows) {}

  int64_t size() const override { return (tokens_.size() - 1) / seq_len_; }

 protected:
  Batch fetch(const std::vector<int64_t>& indices, const Epoch& epoch) const override {
    check_indices(indices, size(), "tokens");
    const auto b = static_cast<int64_t>(indices.size());
    const int64_t t = seq_len_;
    auto inputs = torch::empty({b, t}, torch::kInt64);   // [B, T]
    auto targets = torch::empty({b, t}, torch::kInt64);  // [B, T]
    auto* in = inputs.data_ptr<int64_t>();
    auto* out = targets.data_ptr<int64_t>();
    const int64_t last_start = tokens_.size() - t - 1;
    std::vector<int64_t> window(static_cast<size_t>(t + 1));
    std::vector<uint8_t> mask(tokens_.mask ? static_cast<size_t>(t + 1) : 0);
    for (int64_t i = 0; i < b; ++i) {
      const int64_t n = indices[static_cast<size_t>(i)];
      int64_t start = n * t;
      if (random_) {
        Rng rng(epoch.sample_seed(n));
        start = rng.below(last_start + 1);
      }
      tokens_.read(start, t + 1, window.data());  // [T + 1]
      std::copy(window.begin(), window.end() - 1, in + i * t);
      std::copy(window.begin() + 1, window.end(), out + i * t);
      if (tokens_.mask) {  // targets that do not train
        tokens_.read_mask(start, t + 1, mask.data());
        for (int64_t k = 0; k < t; ++k) {
          if (mask[k + 1] == 0) out[i * t + k] = kIgnoreTarget;
        }
      }
    }
    return Batch{inputs, targets};
  }

 private:
  TokenRange tokens_;
  int64_t seq_len_;
  bool random_;
};

// The mask file of token file `path`: its name with the extension .mask (train.bin: train.mask).
std::string mask_path(const std::string& path) {
  const size_t slash = path.rfind('/');
  const size_t dot = path.rfind('.');
  const bool suffix = dot != std::string::npos && (slash == std::string::npos || dot > slash + 1);
  return (suffix ? path.substr(0, dot) : path) + ".mask";
}

const char* width_name(int64_t width) {
  return width == 4 ? "uint32" : width == 2 ? "uint16" : "bytes";
}

// The bytes per token of `path`: its sidecar's dtype (data.token_format, when set, must agree),
// else data.token_format, where auto reads a .bin file as uint16 and any other as bytes.
int64_t token_width(const std::string& path, const std::string& format,
                    const std::optional<TokenSidecar>& sidecar) {
  if (sidecar) {
    if (format != "auto" && format != sidecar->dtype) {
      throw DataConfigError("data.token_format",
                            format + ", but " + token_sidecar_path(path) + " says " + path +
                                " holds " + sidecar->dtype +
                                " tokens (as trainer tokenize wrote it); leave "
                                "data.token_format at auto, or set it to " +
                                sidecar->dtype);
    }
    return sidecar->width();
  }
  const bool bin = path.size() >= 4 && path.compare(path.size() - 4, 4, ".bin") == 0;
  return format == "uint32" ? 4 : format == "uint16" || (format == "auto" && bin) ? 2 : 1;
}

// Whether a file read as uint16 looks like uint32 tokens: over its first 64 KiB (at least 256
// pairs of uint16), every second one is below 16 (the high half of an id of a vocabulary under
// a million) while the others reach past 255. Real uint16 token streams are not so.
bool looks_like_uint32(const TokenFile& file) {
  const size_t n = std::min<size_t>(file.size(), 65536) / 4 * 4;
  if (n < 256 * 4) return false;
  std::vector<uint8_t> bytes(n);
  file.read(0, n, bytes.data());
  uint32_t low_max = 0;
  for (size_t i = 0; i < n; i += 4) {
    if (bytes[i + 3] != 0 || bytes[i + 2] >= 16) return false;
    low_max = std::max<uint32_t>(low_max, bytes[i] | uint32_t{bytes[i + 1]} << 8);
  }
  return low_max > 255;
}

// The size checks of a token file: a whole number of tokens, as many as its sidecar says; a .bin
// file read as uint16 by its suffix alone that is not uint32 in disguise.
void check_token_file(const TokenRange& r, const std::string& format) {
  const std::string& path = r.file->path();
  const auto size = static_cast<int64_t>(r.file->size());
  if (r.sidecar && size != r.sidecar->tokens * r.width) {
    throw DataConfigError(
        "data.root", path + ": " + std::to_string(size) + " bytes, but " +
                         token_sidecar_path(path) + " says it holds " +
                         std::to_string(r.sidecar->tokens) + " " + r.sidecar->dtype + " tokens (" +
                         std::to_string(r.sidecar->tokens * r.width) +
                         " bytes); the file was cut off or written again without its "
                         "description: write both with trainer tokenize");
  }
  if (size % r.width != 0) {
    throw DataConfigError(format == "auto" ? "data.root" : "data.token_format",
                          path + ": " + std::to_string(size) + " bytes is not a whole number of " +
                              width_name(r.width) +
                              " tokens; the file is truncated or not a token file (set "
                              "data.token_format: bytes for text)");
  }
  if (!r.sidecar && format == "auto" && r.width == 2 && looks_like_uint32(*r.file)) {
    throw DataConfigError(
        "data.token_format",
        path +
            ": auto reads a .bin file as uint16, but every second uint16 of its start is "
            "below 16, as the high halves of uint32 tokens are (trainer tokenize writes "
            "uint32 for vocabularies past 65536); set data.token_format: uint32 (or uint16 if "
            "it is uint16), or write it again with trainer tokenize, whose " +
            token_sidecar_path(path) + " says its width");
  }
}

TokenRange open_tokens(const std::string& path, const std::string& format) {
  TokenRange r;
  r.sidecar = read_token_sidecar(path);
  r.width = token_width(path, format, r.sidecar);
  r.file = std::make_shared<const TokenFile>(path);
  check_token_file(r, format);
  r.end = static_cast<int64_t>(r.file->size()) / r.width;
  const std::string mask = mask_path(path);
  if (is_file(mask)) {
    r.mask = std::make_shared<const TokenFile>(mask);
    if (static_cast<int64_t>(r.mask->size()) != r.end) {
      throw DataError(mask + ": " + std::to_string(r.mask->size()) + " bytes for the " +
                      std::to_string(r.end) + " tokens of " + path +
                      "; a mask file holds one byte a token (1: it trains, 0: it does not), as "
                      "scripts/render_chat.py writes it");
    }
  }
  return r;
}

// "PATH (uint32, described by PATH.json: a vocabulary of N tokens)", for messages.
std::string described(const TokenRange& r) {
  std::string out = r.file->path() + " (" + width_name(r.width);
  if (r.sidecar) {
    out += ", described by " + token_sidecar_path(r.file->path()) + ": a vocabulary of " +
           std::to_string(r.sidecar->vocab_size) + " tokens";
    if (!r.sidecar->tokenizer_path.empty()) out += " from " + r.sidecar->tokenizer_path;
  }
  return out + ")";
}

// The training and validation files hold ids of one width and, where both are described, of one
// tokenizer.
void check_splits_agree(const TokenRange& train, const TokenRange& val) {
  if (train.file->path() == val.file->path()) return;
  bool differ = train.width != val.width;
  if (train.sidecar && val.sidecar) {
    const auto &a = *train.sidecar, &b = *val.sidecar;
    differ = differ || a.vocab_size != b.vocab_size ||
             (!a.tokenizer_xxh64.empty() && !b.tokenizer_xxh64.empty() &&
              a.tokenizer_xxh64 != b.tokenizer_xxh64);
  }
  if (!differ) return;
  throw DataConfigError("data.root", described(train) + " and " + described(val) +
                                         " differ: an id would mean another token in each; "
                                         "write both with trainer tokenize and one tokenizer");
}

// The vocabulary of the token ids: 256 for bytes; the sidecar's (no id may reach it), else the
// largest id + 1. `known`: whether it is the vocabulary itself.
int64_t vocabulary(const TokenRange& train, const TokenRange& val, bool& known) {
  known = train.width == 1;
  if (known) return 256;
  int64_t largest = 0;
  for (const TokenRange* r : {&train, &val}) {
    const int64_t m = r->max_token();
    largest = std::max(largest, m);
    if (r->sidecar && m >= r->sidecar->vocab_size) {
      throw DataConfigError("data.root", r->file->path() + " holds id " + std::to_string(m) +
                                             ", past the vocabulary of " +
                                             std::to_string(r->sidecar->vocab_size) +
                                             " tokens that " + token_sidecar_path(r->file->path()) +
                                             " gives; the file and its description disagree: "
                                             "write both with trainer tokenize");
    }
  }
  if (!train.sidecar) return largest + 1;
  known = true;
  return train.sidecar->vocab_size;
}

void check_length(const TokenRange& r, int64_t seq_len, const std::string& what) {
  if (r.size() < seq_len + 1) {
    throw DataError(r.file->path() + ": " + what + " has " + std::to_string(r.size()) +
                    " tokens, fewer than data.seq_len + 1 = " + std::to_string(seq_len + 1));
  }
}

// The `data.` keys of tokens.
struct TokensOptions {
  std::string token_format = "auto";  // uint16 (nanoGPT .bin), uint32, bytes, auto (the
                                      // sidecar's dtype, else by suffix)
  int64_t seq_len = 0;                // tokens per sample; 0 = the model's context length
  double val_fraction = 0.1;          // tail of a single file held out for validation

  template <class V>
  void visit(V& v) {
    v("token_format", token_format);
    v("seq_len", seq_len);
    v("val_fraction", val_fraction);
  }
  void validate(config::Checks& c) const {
    c.one_of("token_format", token_format, {"auto", "uint16", "uint32", "bytes"});
    c.at_least("seq_len", seq_len, 0);
    check_val_fraction(c, val_fraction);
  }
};

Splits make_tokens(const config::DataConfig& cfg, const DataContext& ctx) {
  const auto& o = cfg.own<TokensOptions>();
  if (cfg.root.empty()) {
    throw DataConfigError("data.root",
                          "set it to a token file (uint16 .bin, or text read as bytes) or a "
                          "folder with train.bin and val.bin");
  }
  const int64_t seq_len = sequence_length(o.seq_len, ctx);
  const std::string root = strip_slashes(cfg.root);
  TokenRange train, val;
  if (is_directory(root)) {
    for (const char* name : {"train.bin", "val.bin"}) {
      if (!is_file(root + "/" + name)) {
        throw DataConfigError("data.root", root + ": no " + name +
                                               " in this folder (a token folder holds train.bin "
                                               "and val.bin)");
      }
    }
    train = open_tokens(root + "/train.bin", o.token_format);
    val = open_tokens(root + "/val.bin", o.token_format);
    check_splits_agree(train, val);
    check_length(train, seq_len, "the training split");
    check_length(val, seq_len, "the validation split");
  } else if (is_file(root)) {
    train = open_tokens(root, o.token_format);
    val = train;
    const auto held_out = static_cast<int64_t>(static_cast<double>(train.size()) * o.val_fraction);
    train.end = train.begin + train.size() - held_out;
    val.begin = train.end;
    check_length(train, seq_len, "the training part (before data.val_fraction)");
    check_length(val, seq_len, "the validation part (data.val_fraction)");
  } else {
    throw DataConfigError("data.root", root + ": no such file or directory");
  }
  if (train.mask) {
    log::info(strprintf("tokens: %s: %.1f%% of the training tokens train",
                        train.mask->path().c_str(),
                        100.0 * static_cast<double>(train.trained()) /
                            static_cast<double>(std::max<int64_t>(1, train.size()))));
  }
  Splits splits;
  splits.spec.sample_shape = {seq_len};
  splits.spec.sequence = true;
  splits.spec.num_classes = vocabulary(train, val, splits.spec.vocabulary_known);
  if (train.sidecar) log::info("tokens: " + described(train));
  splits.train = std::make_shared<Tokens>(std::move(train), seq_len, /*random_windows=*/true);
  splits.val = std::make_shared<Tokens>(std::move(val), seq_len, /*random_windows=*/false);
  return splits;
}

}  // namespace

void register_tokens(DatasetRegistry& registry) {
  registry.add("tokens", make_tokens, config::options_of<TokensOptions>());
}

}  // namespace trainer::data
