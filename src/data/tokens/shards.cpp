#include "data/tokens/shards.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "data/dataset.h"

namespace trainer::data {
namespace {

constexpr int64_t kBlock = 512;

// The most names a brace pattern may expand to: far more shards than a data set has, and few
// enough to list (a range such as {000000..999999999} is a mistake, not 17 GB of names).
constexpr uint64_t kMaxNames = 1000000;

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// One brace of a pattern: a range of numbers ("000..146", "5..1") or a list of alternatives.
struct Brace {
  std::vector<std::string> items;  // a list's alternatives
  bool range = false;
  int64_t first = 0, last = 0;  // a range's ends, counted up or (first > last) down
  size_t width = 0;             // zero-padded to this many digits
  std::string text;             // as written, for messages

  uint64_t count() const {
    if (!range) return items.size();
    return static_cast<uint64_t>(first <= last ? last - first : first - last) + 1;
  }
  std::string at(uint64_t i) const {
    if (!range) return items[static_cast<size_t>(i)];
    const auto step = static_cast<int64_t>(i);
    std::string n = std::to_string(first <= last ? first + step : first - step);
    if (n.size() < width) n.insert(0, width - n.size(), '0');
    return n;
  }
};

// A brace's body: "a,b" or "000..146". A range is padded as bash and braceexpand pad it: when
// either end starts with a zero, to the longer end's width.
Brace parse_brace(const std::string& body, const std::string& pattern) {
  Brace brace;
  brace.text = "{" + body + "}";
  const auto dots = body.find("..");
  if (dots != std::string::npos && body.find(',') == std::string::npos) {
    const std::string lo = body.substr(0, dots), hi = body.substr(dots + 2);
    if (!all_digits(lo) || !all_digits(hi) || lo.size() > 18 || hi.size() > 18) {
      throw std::invalid_argument(pattern + ": {" + body +
                                  "} is not a range of numbers such as {000..146}");
    }
    brace.range = true;
    brace.first = std::stoll(lo);
    brace.last = std::stoll(hi);
    const bool padded = (lo.size() > 1 && lo[0] == '0') || (hi.size() > 1 && hi[0] == '0');
    brace.width = padded ? std::max(lo.size(), hi.size()) : 0;
    return brace;
  }
  size_t start = 0;
  for (size_t comma; (comma = body.find(',', start)) != std::string::npos; start = comma + 1) {
    brace.items.push_back(body.substr(start, comma - start));
  }
  brace.items.push_back(body.substr(start));
  return brace;
}

// An octal header field, or GNU's base-256 for large sizes; -1 when malformed.
int64_t header_number(const uint8_t* field, size_t width) {
  if (field[0] & 0x80) {
    int64_t v = field[0] & 0x7f;
    for (size_t i = 1; i < width; ++i) v = (v << 8) | field[i];
    return v;
  }
  int64_t v = 0;
  size_t i = 0;
  while (i < width && field[i] == ' ') ++i;
  bool any = false;
  for (; i < width && field[i] >= '0' && field[i] <= '7'; ++i, any = true)
    v = v * 8 + (field[i] - '0');
  if (i < width && field[i] != 0 && field[i] != ' ') return -1;
  return any ? v : 0;
}

std::string header_text(const uint8_t* field, size_t width) {
  const auto* p = reinterpret_cast<const char*>(field);
  return std::string(p, strnlen(p, width));
}

bool checksum_ok(const uint8_t* h) {
  int64_t sum = 0;
  for (int64_t i = 0; i < kBlock; ++i) sum += (i >= 148 && i < 156) ? ' ' : h[i];
  return header_number(h + 148, 8) == sum;
}

// The `path` record of a pax extended header's data ("<len> path=<name>\n" ...), or "".
std::string pax_path(const std::vector<uint8_t>& data) {
  const std::string text(data.begin(), data.end());
  for (size_t at = 0; at < text.size();) {
    const auto space = text.find(' ', at);
    if (space == std::string::npos) break;
    const int64_t len = std::atoll(text.substr(at, space - at).c_str());
    if (len <= 0 || at + static_cast<size_t>(len) > text.size()) break;
    const std::string record = text.substr(space + 1, at + static_cast<size_t>(len) - space - 2);
    if (record.rfind("path=", 0) == 0) return record.substr(5);
    at += static_cast<size_t>(len);
  }
  return "";
}

}  // namespace

std::vector<std::string> expand_braces(const std::string& pattern) {
  std::vector<std::string> literals;  // the text around the braces: one more than braces
  std::vector<Brace> braces;
  for (size_t at = 0;;) {
    const auto open = pattern.find('{', at);
    const auto stray = pattern.find('}', at);
    if (stray < open) throw std::invalid_argument(pattern + ": a '}' without its '{'");
    literals.push_back(pattern.substr(at, open == std::string::npos ? open : open - at));
    if (open == std::string::npos) break;
    const auto close = pattern.find('}', open);
    if (close == std::string::npos) {
      throw std::invalid_argument(pattern + ": a '{' without its '}'");
    }
    braces.push_back(parse_brace(pattern.substr(open + 1, close - open - 1), pattern));
    at = close + 1;
  }
  uint64_t total = 1;  // counted before anything is expanded
  for (const auto& brace : braces) {
    const uint64_t n = brace.count();
    if (n > 0 && total > kMaxNames / n) {
      throw std::invalid_argument(
          pattern + ": names more than " + std::to_string(kMaxNames) + " files" +
          (n > kMaxNames ? " (" + brace.text + " alone " + std::to_string(n) + ")" : "") +
          ", more shards than a data set has; check the ranges' ends (e.g. {000000..000146} for "
          "147 shards)");
    }
    total *= n;
  }
  std::vector<std::string> out;
  out.reserve(static_cast<size_t>(total));
  for (uint64_t k = 0; k < total; ++k) {  // the last brace varies fastest
    std::string name = literals.back();
    for (uint64_t rest = k, i = braces.size(); i-- > 0;) {
      const uint64_t n = braces[i].count();
      name = literals[i] + braces[i].at(rest % n) + name;
      rest /= n;
    }
    out.push_back(std::move(name));
  }
  return out;
}

RandomAccessFile::RandomAccessFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd_ < 0 || ::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    const std::string why = fd_ < 0 ? std::strerror(errno) : "not a regular file";
    if (fd_ >= 0) ::close(fd_);
    throw DataError(path_ + ": cannot open: " + why);
  }
  size_ = static_cast<int64_t>(st.st_size);
}

RandomAccessFile::~RandomAccessFile() {
  if (fd_ >= 0) ::close(fd_);
}

std::vector<uint8_t> RandomAccessFile::read(int64_t offset, int64_t size) const {
  std::vector<uint8_t> out(static_cast<size_t>(size));
  int64_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd_, out.data() + done, static_cast<size_t>(size - done),
                              static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      throw DataError(path_ + ": cannot read " + std::to_string(size) + " bytes at offset " +
                      std::to_string(offset) + ": " +
                      (n < 0 ? std::strerror(errno) : "the file ends first"));
    }
    done += n;
  }
  return out;
}

TarListing list_tar(const RandomAccessFile& file) {
  TarListing out;
  std::string long_name;  // from a GNU 'L' or pax 'x' header, for the next member
  for (int64_t at = 0;;) {
    if (at + kBlock > file.size()) {  // a missing end-of-archive block alone is tolerated
      if (at != file.size()) {
        out.problem = "truncated: the file ends at byte " + std::to_string(file.size()) +
                      ", inside the block at byte " + std::to_string(std::min(at, file.size()));
        if (at > file.size() && !out.members.empty()) {  // inside the last member's padding
          out.cut_name = out.members.back().name;
          out.members.pop_back();
        }
      }
      return out;
    }
    const auto h = file.read(at, kBlock);
    if (std::all_of(h.begin(), h.end(), [](uint8_t b) { return b == 0; })) return out;
    if (!checksum_ok(h.data())) {
      out.problem = "not a tar header at byte " + std::to_string(at) + " (checksum mismatch)";
      return out;
    }
    const int64_t size = header_number(h.data() + 124, 12);
    std::string name = header_text(h.data(), 100);
    const std::string prefix = header_text(h.data() + 345, 155);
    if (!prefix.empty() && std::memcmp(h.data() + 257, "ustar", 5) == 0) name = prefix + "/" + name;
    if (!long_name.empty()) name = std::move(long_name), long_name.clear();
    const char type = static_cast<char>(h[156]);
    const int64_t data = at + kBlock;
    if (size < 0 || data + size > file.size()) {
      out.problem = "truncated: member '" + name + "' needs " + std::to_string(size) +
                    " bytes from byte " + std::to_string(data) + ", the file ends at byte " +
                    std::to_string(file.size());
      out.cut_name = name;
      return out;
    }
    if (type == 'L') {
      const auto bytes = file.read(data, size);
      long_name = header_text(bytes.data(), bytes.size());
    } else if (type == 'x') {
      long_name = pax_path(file.read(data, size));
    } else if (type == '0' || type == '\0' || type == '7') {
      out.members.push_back({name, data, size});
    }
    at = data + (size + kBlock - 1) / kBlock * kBlock;
  }
}

}  // namespace trainer::data
