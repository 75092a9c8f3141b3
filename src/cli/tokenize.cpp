// trainer tokenize: text files to a token file of the `tokens` data set, with a byte-level BPE
// tokenizer (tokenizer.json, a Hugging Face model folder, or GPT-2's encoder.json and vocab.bpe).
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <thread>

#include "cli/commands.h"
#include "cli/options.h"
#include "cli/tokenizer_option.h"
#include "text/tokens/token_sidecar.h"
#include "text/tokens/tokenize.h"
#include "util/fileio.h"
#include "util/format.h"

namespace trainer::cli {

namespace {

// --format: bytes per token for a vocabulary of `tokens`.
int token_width(const std::string& format, int64_t tokens) {
  if (format != "auto" && format != "uint16" && format != "uint32") {
    throw UsageError("--format: expected auto, uint16 or uint32, got '" + format + "'");
  }
  const bool fits16 = tokens <= 65536;
  if (format == "uint16" && !fits16) {
    throw UsageError("--format uint16: the tokenizer has " + std::to_string(tokens) +
                     " tokens, more than uint16 holds; use uint32");
  }
  return format == "uint32" || (format == "auto" && !fits16) ? 4 : 2;
}

// UsageError unless each text file exists and is a regular file (a FIFO would block the read).
void check_inputs(const std::vector<std::string>& files) {
  for (const auto& file : files) {
    const std::string why = input_problem(file);
    if (!why.empty()) throw UsageError(why + "; give the text files to encode");
  }
}

// UsageError unless the text files are readable (check_inputs) and --out may be written: not a
// device, FIFO or folder, and neither one of the text files nor a file of the tokenizer's folder.
void check_paths(const std::string& out, const std::vector<std::string>& files,
                 const std::string& tokenizer) {
  check_inputs(files);
  std::vector<std::string> inputs = files;
  inputs.push_back(tokenizer);  // a tokenizer.json named itself
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(tokenizer, ec)) {
    inputs.push_back(entry.path().string());
  }
  for (const auto& path : {out, data::token_sidecar_path(out)}) {
    const std::string why = output_problem(path, OutputKind::file, inputs);
    if (!why.empty()) throw UsageError("--out " + why);
  }
}

// --threads: 0 for one per core, else at most kMaxThreads (each is a thread and a cache).
int encoding_threads(int threads) {
  constexpr int kMaxThreads = 1024;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (threads < 0) throw UsageError("--threads: expected 0 (one per core) or more");
  if (threads > kMaxThreads) {
    throw UsageError(
        strprintf("--threads %d: at most %d (this machine has %d cores; 0: one per core)", threads,
                  kMaxThreads, cores));
  }
  return threads == 0 ? cores : threads;
}

cxxopts::Options tokenize_options() {
  cxxopts::Options options("trainer tokenize",
                           "Encodes text files with a byte-level BPE tokenizer into a token file "
                           "(data.name: tokens), the end-of-text token between the files, and "
                           "FILE.json beside it: the token width, count, vocabulary size and "
                           "tokenizer, from which data.name: tokens reads the file.");
  // clang-format off
  options.add_options()
      ("tokenizer", "a tokenizer.json file, a folder holding one (a Hugging Face model folder), or "
       "a folder with GPT-2's encoder.json and vocab.bpe", cxxopts::value<std::string>(), "PATH")
      ("allow-special", "match special tokens written in the text (as tokenizers' encode does); "
       "default: encode them as text")
      ("out", "the token file to write (written atomically), e.g. train.bin; its description "
       "goes to FILE.json (train.bin.json)",
       cxxopts::value<std::string>(), "FILE")
      ("threads", "encoding threads, at most 1024 (0: one per core)",
       cxxopts::value<int>()->default_value("0"), "N")
      ("format", "token width: uint16 (nanoGPT's .bin), uint32, or auto (uint16 when the "
       "vocabulary fits)", cxxopts::value<std::string>()->default_value("auto"), "F")
      ("json", "print one JSON object instead of the line")
      ("files", "the text files, one document each", cxxopts::value<std::vector<std::string>>())
      ("h,help", "print this help");
  // clang-format on
  options.parse_positional({"files"});
  options.positional_help("FILES...");
  return options;
}

}  // namespace

int tokenize_command(int argc, char** argv) {
  auto options = tokenize_options();
  const cxxopts::ParseResult args = parse_or_usage(options, argc, argv);
  if (args.count("help")) {
    std::cout << options.help();
    return 0;
  }
  if (!args.count("tokenizer") || !args.count("out") || !args.count("files")) {
    throw UsageError("tokenize needs --tokenizer PATH, --out FILE and one or more text files");
  }
  const auto out = args["out"].as<std::string>();
  const auto files = args["files"].as<std::vector<std::string>>();
  check_paths(out, files, args["tokenizer"].as<std::string>());
  const data::BpeTokenizer tokenizer = load_tokenizer_or_usage(args["tokenizer"].as<std::string>());
  const int width = token_width(args["format"].as<std::string>(), tokenizer.vocab_size());
  const int threads = encoding_threads(args["threads"].as<int>());
  const auto start = std::chrono::steady_clock::now();
  const auto r =
      data::tokenize_files(tokenizer, files, out, width, threads, args.count("allow-special") > 0);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double rate = seconds > 0 ? static_cast<double>(r.tokens) / seconds : 0.0;
  const char* type = width == 2 ? "uint16" : "uint32";
  if (args.count("json")) {
    std::cout << nlohmann::json{{"out", out},
                                {"sidecar", r.sidecar},
                                {"tokens", r.tokens},
                                {"documents", r.documents},
                                {"bytes", r.bytes},
                                {"format", type},
                                {"vocab_size", tokenizer.vocab_size()},
                                {"threads", threads},
                                {"seconds", seconds},
                                {"tokens_per_sec", rate}}
                     .dump()
              << "\n";
  } else {
    std::cout << strprintf("wrote %s: %" PRId64 " tokens (%s) of %" PRId64
                           " document%s, %.1f MB of text, in %.2f s: %.0f tokens/s on %d threads; "
                           "described in %s\n",
                           out.c_str(), r.tokens, type, r.documents, r.documents == 1 ? "" : "s",
                           r.bytes / 1e6, seconds, rate, threads, r.sidecar.c_str());
  }
  return 0;
}

}  // namespace trainer::cli
