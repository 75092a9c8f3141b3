// trainer generate: text sampled from a language model checkpoint, streamed as it is produced;
// bytes, or a byte-level BPE tokenizer's tokens with --tokenizer (tokenizer.json, a Hugging Face
// model folder, or GPT-2's encoder.json and vocab.bpe).
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/hf_folder.h"
#include "cli/checkpoint_model.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "cli/tokenizer_option.h"
#include "distributed/env.h"
#include "engine/loop/trainer.h"
#include "engine/use/generator.h"
#include "util/format.h"

namespace trainer::cli {
namespace {

constexpr int64_t kByteVocabulary = 256;

// The text to continue; "" when none was given (--prompt "" or an empty --prompt-file).
std::string prompt_text(const cxxopts::ParseResult& args) {
  if (args.count("prompt-file") && args.count("prompt")) {
    throw UsageError("--prompt and --prompt-file both give the text to continue; give one");
  }
  if (!args.count("prompt-file")) return args["prompt"].as<std::string>();
  const std::string path = args["prompt-file"].as<std::string>();
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw UsageError("--prompt-file: " + path + " is a directory; give a text file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("--prompt-file: cannot read " + path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

engine::SamplingOptions sampling_options(const cxxopts::ParseResult& args) {
  engine::SamplingOptions o;
  o.max_new_tokens = args["max-new-tokens"].as<int64_t>();
  o.temperature = args["temperature"].as<double>();
  o.top_k = args["top-k"].as<int64_t>();
  o.top_p = args["top-p"].as<double>();
  o.seed = args["seed"].as<uint64_t>();
  if (o.max_new_tokens < 1) throw UsageError("--max-new-tokens must be at least 1");
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature)) {
    throw UsageError("--temperature must be 0 (the likeliest token) or positive and finite");
  }
  if (args["num-samples"].as<int64_t>() < 1) throw UsageError("--num-samples must be at least 1");
  if (o.top_k < 0) throw UsageError("--top-k must not be negative");
  if (!(o.top_p > 0 && o.top_p <= 1)) throw UsageError("--top-p must be in (0, 1]");
  return o;
}

cxxopts::Options generate_options() {
  cxxopts::Options options("trainer generate",
                           "Samples text from a language model checkpoint (gpt).");
  // clang-format off
  add_checkpoint_options(options);
  options.add_options()
      ("tokenizer", "a tokenizer.json file, a folder holding one (a Hugging Face model folder), "
       "or a folder with GPT-2's encoder.json and vocab.bpe: text as that tokenizer's tokens; "
       "default: the tokenizer.json of the model's model.pretrained folder, else bytes",
       cxxopts::value<std::string>(), "PATH")
      ("prompt", "the text to continue", cxxopts::value<std::string>()->default_value(""), "TEXT")
      ("prompt-file", "the text to continue, from a file", cxxopts::value<std::string>(), "FILE")
      ("max-new-tokens", "tokens to generate", cxxopts::value<int64_t>()->default_value("256"), "N")
      ("temperature", "divides the logits; 0 = the likeliest token",
       cxxopts::value<double>()->default_value("1.0"), "T")
      ("top-k", "sample among the k likeliest tokens; 0 = all",
       cxxopts::value<int64_t>()->default_value("0"), "K")
      ("top-p", "sample among the fewest likeliest tokens holding this probability",
       cxxopts::value<double>()->default_value("1.0"), "P")
      ("seed", "the sampling's seed: the same seed gives the same text",
       cxxopts::value<uint64_t>()->default_value("0"), "S")
      ("num-samples", "samples, one after another", cxxopts::value<int64_t>()->default_value("1"),
       "N")
      ("no-cache", "recompute the whole sequence for every token (no key/value cache)")
      ("ignore-eos", "generate --max-new-tokens tokens even past an end-of-sequence token (by "
       "default the text ends at any eos_token_id of the model's Hugging Face folder)")
      ("h,help", "print this help");
  // clang-format on
  return options;
}

// The tokens of `text` as tokenizers' encode(text) gives them: special tokens written in it
// matched, and the post-processor's bos (Llama 3's) before them. An empty text is the bos, else
// the end-of-text token (GPT-2's <|endoftext|>, as GPT-2 starts).
std::vector<int64_t> tokenizer_ids(const data::BpeTokenizer& bpe, const std::string& text) {
  if (text.empty()) {
    const int64_t start = bpe.bos_id() >= 0 ? bpe.bos_id() : bpe.end_of_text();
    if (start < 0) {
      throw UsageError("--tokenizer: " + bpe.source() +
                       " names no bos or end-of-text token to start from; give a --prompt");
    }
    return {start};
  }
  std::vector<int64_t> ids = bpe.encode(text, /*allow_special=*/true);
  if (bpe.added_bos_id() >= 0 && ids.front() != bpe.added_bos_id()) {
    ids.insert(ids.begin(), bpe.added_bos_id());
  }
  return ids;
}

// The tokenizer: --tokenizer, else the tokenizer.json of the model's Hugging Face folder
// (model.pretrained: DIR); "" for none.
std::string tokenizer_path(const cxxopts::ParseResult& args, const config::LoadedConfig& loaded) {
  if (args.count("tokenizer")) return args["tokenizer"].as<std::string>();
  const std::string& dir = loaded.cfg.model.pretrained;
  std::error_code ec;
  const bool has =
      checkpoint::is_directory(dir) &&
      std::filesystem::is_regular_file(std::filesystem::path(dir) / "tokenizer.json", ec);
  return has ? dir : "";
}

// The prompt's tokens: the `tokenizer`'s (its tokenizer into `bpe`), else bytes; the model's
// `vocabulary` must hold them.
std::vector<int64_t> prompt_ids(const std::string& tokenizer, const std::string& text,
                                int64_t vocabulary, std::unique_ptr<data::BpeTokenizer>& bpe) {
  std::vector<int64_t> ids;
  if (!tokenizer.empty()) {
    bpe = std::make_unique<data::BpeTokenizer>(load_tokenizer_or_usage(tokenizer));
    if (vocabulary < bpe->vocab_size()) {
      throw UsageError("--tokenizer: the model's vocabulary has " + std::to_string(vocabulary) +
                       " tokens, fewer than the tokenizer's " + std::to_string(bpe->vocab_size()));
    }
    ids = tokenizer_ids(*bpe, text);
  } else if (vocabulary != kByteVocabulary) {
    throw UsageError("generate: the model's vocabulary has " + std::to_string(vocabulary) +
                     " tokens; give --tokenizer PATH (tokenizer.json, a model folder, or GPT-2's "
                     "encoder.json and vocab.bpe), or use a byte-level model "
                     "(256: data.token_format bytes)");
  } else {
    for (const unsigned char c : text) ids.push_back(c);
  }
  return ids;
}

// The tokens that end the text: eos_token_id of generation_config.json or config.json (one id or
// a list) in the run's model.pretrained folder, else in the --tokenizer folder; none with
// --ignore-eos.
std::vector<int64_t> stop_ids(const cxxopts::ParseResult& args,
                              const config::LoadedConfig& loaded) {
  if (args.count("ignore-eos")) return {};
  for (const std::string& dir :
       {loaded.cfg.model.pretrained,
        args.count("tokenizer") ? args["tokenizer"].as<std::string>() : std::string()}) {
    if (!checkpoint::is_directory(dir)) continue;
    try {
      return checkpoint::hf_eos_token_ids(dir);
    } catch (const checkpoint::FormatError& e) {
      throw UsageError(std::string("generate: ") + e.what());
    }
  }
  return {};
}

}  // namespace

int generate_command(int argc, char** argv) {
  auto options = generate_options();
  const cxxopts::ParseResult args = parse_or_usage(options, argc, argv);
  if (args.count("help")) {
    std::cout << options.help();
    return 0;
  }
  auto sampling = sampling_options(args);
  if (distributed::read_process_env().launched()) {
    throw UsageError("generate runs in one process: run it without trainer launch");
  }
  const auto m = load_checkpoint_model(args, distributed::DistEnv{}, "generate");
  auto& trainer = *m.trainer;
  const std::string& checkpoint = m.checkpoint;
  const auto& loaded = m.loaded;
  sampling.stop_ids = stop_ids(args, loaded);
  auto decoder = trainer.decoder(/*use_cache=*/args.count("no-cache") == 0);
  if (!decoder) {
    throw UsageError("generate: " + checkpoint + " holds a " + loaded.cfg.model.name +
                     ", which is not a language model (gpt is)");
  }
  const std::string given = prompt_text(args);
  // Without a prompt, a start as nanoGPT's sample.py has: a newline byte, or the tokenizer's bos
  // (GPT-2's <|endoftext|>).
  const std::string tokenizer = tokenizer_path(args, loaded);
  const std::string text = given.empty() && tokenizer.empty() ? "\n" : given;
  // The text's tokens and each token's bytes: the tokenizer's, or the bytes themselves.
  std::unique_ptr<data::BpeTokenizer> bpe;
  const std::vector<int64_t> ids = prompt_ids(tokenizer, text, decoder->vocabulary(), bpe);
  const auto prompt =
      torch::tensor(ids, torch::kLong).view({1, -1}).to(trainer.device());  // [1, T]
  const auto bytes_of = [&](int64_t id) {
    if (!bpe) return std::string(1, static_cast<char>(id));
    return id < bpe->vocab_size() ? bpe->token_bytes(id) : std::string();
  };
  auto generator = at::detail::createCPUGenerator(sampling.seed);
  int64_t tokens = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t s = 0; s < args["num-samples"].as<int64_t>(); ++s) {
    if (s > 0) std::cout << "\n---\n";
    std::cout << text << std::flush;
    const auto out = engine::generate(*decoder, prompt, sampling, generator,
                                      [&](int64_t id) { std::cout << bytes_of(id) << std::flush; });
    tokens += static_cast<int64_t>(out.size());
  }
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  std::cout << "\n";
  std::cerr << strprintf("generated %" PRId64 " tokens in %.2f s (%.1f tokens/s, %s)\n", tokens,
                         took.count(), tokens / took.count(),
                         args.count("no-cache") ? "no cache" : "key/value cache");
  return 0;
}

}  // namespace trainer::cli
