// Helper of tests/bpe_check.py and tests/hf_tokenizer_check.py: the byte-level BPE tokenizer of
// text/tokenizer/hf_tokenizer.h on given texts.
//
//   bpe_tool TOKENIZER TEXT_FILE
//       the ids of the file's text (special tokens as text), space-separated, on one line; exits
//       1 when decoding them does not give the text back
//   bpe_tool --encode TOKENIZER IN OUT [--special]
//       IN: texts, each a little-endian uint32 length and its bytes; OUT: for each, a uint32
//       count and its ids (uint32), encoded with one piece cache for all (--special: special
//       tokens in the text matched)
//   bpe_tool --decode TOKENIZER IN OUT
//       IN: id sequences as OUT above; OUT: each one's bytes, as IN above
//   bpe_tool --info TOKENIZER
//       one JSON object: vocab_size, bos, eos, added_bos, end_of_text, and the id of each token
//       given after TOKENIZER (token_to_id) with its bytes back (id_to_token)
//   bpe_tool --time-load TOKENIZER [N]
//       loads it N times (default 5) in this process; one JSON object: seconds (each load's
//       wall time: files read, parsed and the tables built), median, vocab_size
//
// TOKENIZER: a tokenizer.json, a folder holding one, or a folder with encoder.json and vocab.bpe.
// Exits 2 for a tokenizer of a kind not built, 1 for other errors, each with one line.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "text/tokenizer/hf_tokenizer.h"

namespace {

using trainer::data::BpeTokenizer;

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

uint32_t u32_at(const std::string& s, size_t& at) {
  if (at + 4 > s.size()) throw std::runtime_error("truncated input");
  uint32_t v = 0;
  std::memcpy(&v, s.data() + at, 4);
  at += 4;
  return v;
}

void put_u32(std::string& out, uint32_t v) {
  out.append(reinterpret_cast<const char*>(&v), 4);
}

void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

int encode_texts(const BpeTokenizer& tokenizer, const std::string& in, const std::string& out,
                 bool special) {
  const std::string data = read_all(in);
  std::string result;
  BpeTokenizer::PieceCache cache;
  std::vector<int32_t> ids;
  for (size_t at = 0; at < data.size();) {
    const uint32_t n = u32_at(data, at);
    if (at + n > data.size()) throw std::runtime_error("truncated input");
    ids.clear();
    tokenizer.encode_into(std::string_view(data).substr(at, n), special, &cache, ids);
    at += n;
    put_u32(result, static_cast<uint32_t>(ids.size()));
    for (const int32_t id : ids) put_u32(result, static_cast<uint32_t>(id));
  }
  write_all(out, result);
  return 0;
}

int decode_ids(const BpeTokenizer& tokenizer, const std::string& in, const std::string& out) {
  const std::string data = read_all(in);
  std::string result;
  for (size_t at = 0; at < data.size();) {
    std::vector<int64_t> ids(u32_at(data, at));
    for (auto& id : ids) id = u32_at(data, at);
    const std::string bytes = tokenizer.decode(ids);
    put_u32(result, static_cast<uint32_t>(bytes.size()));
    result += bytes;
  }
  write_all(out, result);
  return 0;
}

int info(const BpeTokenizer& tokenizer, int argc, char** argv) {
  nlohmann::json j = {{"vocab_size", tokenizer.vocab_size()},
                      {"bos", tokenizer.bos_id()},
                      {"eos", tokenizer.eos_id()},
                      {"added_bos", tokenizer.added_bos_id()},
                      {"end_of_text", tokenizer.end_of_text()}};
  for (int i = 3; i < argc; ++i) {
    const int64_t id = tokenizer.token_to_id(argv[i]);
    j["tokens"][argv[i]] = {{"id", id},
                            {"back", id >= 0 ? tokenizer.id_to_token(id) : std::string()},
                            {"special", tokenizer.is_special(id)}};
  }
  std::cout << j.dump() << "\n";
  return 0;
}

int time_load(const std::string& path, int count) {
  std::vector<double> seconds;
  int64_t vocab_size = 0;
  for (int i = 0; i < count; ++i) {
    const auto start = std::chrono::steady_clock::now();
    const BpeTokenizer tokenizer = trainer::data::load_tokenizer(path);
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    vocab_size = tokenizer.vocab_size();
  }
  std::vector<double> sorted = seconds;
  std::sort(sorted.begin(), sorted.end());
  const nlohmann::json j = {
      {"seconds", seconds}, {"median", sorted[sorted.size() / 2]}, {"vocab_size", vocab_size}};
  std::cout << j.dump() << "\n";
  return 0;
}

int round_trip(const BpeTokenizer& tokenizer, const std::string& path) {
  const std::string text = read_all(path);
  const auto ids = tokenizer.encode(text, /*allow_special=*/false);
  for (const int64_t id : ids) std::cout << id << " ";
  std::cout << "\n";
  if (tokenizer.decode(ids) != text) {
    std::cerr << "bpe_tool: decoding the ids does not give the text back\n";
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const bool ok = (mode == "--encode" && (argc == 5 || argc == 6)) ||
                  (mode == "--decode" && argc == 5) || (mode == "--info" && argc >= 3) ||
                  (mode == "--time-load" && (argc == 3 || (argc == 4 && std::atoi(argv[3]) > 0))) ||
                  (argc == 3 && mode.rfind("--", 0) != 0);
  if (!ok) {
    std::cerr << "usage: bpe_tool TOKENIZER TEXT_FILE | --encode TOKENIZER IN OUT [--special] | "
                 "--decode TOKENIZER IN OUT | --info TOKENIZER [TOKEN...] | "
                 "--time-load TOKENIZER [N]\n";
    return 2;
  }
  try {
    if (argc == 3 && mode.rfind("--", 0) != 0) {
      return round_trip(trainer::data::load_tokenizer(argv[1]), argv[2]);
    }
    if (mode == "--time-load") return time_load(argv[2], argc == 4 ? std::atoi(argv[3]) : 5);
    const BpeTokenizer tokenizer = trainer::data::load_tokenizer(argv[2]);
    if (mode == "--encode") {
      return encode_texts(tokenizer, argv[3], argv[4],
                          argc == 6 && std::string(argv[5]) == "--special");
    }
    if (mode == "--decode") return decode_ids(tokenizer, argv[3], argv[4]);
    return info(tokenizer, argc, argv);
  } catch (const trainer::data::TokenizerUnsupported& e) {
    std::cerr << "bpe_tool: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "bpe_tool: " << e.what() << "\n";
    return 1;
  }
}
