// trainer generate: text sampled from a language model checkpoint, streamed as it is produced;
// bytes, or a byte-level BPE tokenizer's tokens with --tokenizer (tokenizer.json, a Hugging Face
// model folder, or GPT-2's encoder.json and vocab.bpe). With --chat the prompt is a user message
// rendered with the model's chat template (text/chat/chat_template.h) and the reply alone is
// printed.
#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
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
#include "data/tokens/chat.h"
#include "distributed/env.h"
#include "engine/loop/trainer.h"
#include "engine/use/generator.h"
#include "text/chat/chat_encode.h"
#include "util/format.h"
#include "util/log.h"
#include "util/strings.h"

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
      ("chat", "the prompt is a user message: rendered with the model's chat template "
       "(--chat-template, else the run's data.chat_template, else the one recognised in the "
       "tokenizer folder's tokenizer_config.json) and the assistant's generation prompt; prints "
       "the reply alone, "
       "ended at the template's end-of-turn token")
      ("chat-template", "with --chat: render in this built-in chat format (llama3, llama3.1, "
       "llama3.2, chatml, qwen2, qwen2.5, qwen3, plain) instead of the run's data.chat_template "
       "or the tokenizer folder's template", cxxopts::value<std::string>(), "NAME")
      ("system", "with --chat: a system message before the user's", cxxopts::value<std::string>(),
       "TEXT")
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
// matched, and the post-processor's bos (Llama 3's) before them, also before a bos written at the
// text's start (as tokenizers adds it). An empty text is the bos, else the end-of-text token
// (GPT-2's <|endoftext|>, as GPT-2 starts).
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
  if (bpe.added_bos_id() >= 0) ids.insert(ids.begin(), bpe.added_bos_id());
  return ids;
}

// The data.chat_template, data.chat_date and data.tokenizer of a run on chat data; null for a run
// on other data.
const data::ChatOptions* chat_options(const config::LoadedConfig& loaded) {
  const auto& d = loaded.cfg.data;
  return d.name == "chat" ? &d.own<data::ChatOptions>() : nullptr;
}

// The tokenizer: --tokenizer, else a chat run's data.tokenizer, else the tokenizer.json of the
// model's Hugging Face folder (model.pretrained: DIR); "" for none.
std::string tokenizer_path(const cxxopts::ParseResult& args, const config::LoadedConfig& loaded) {
  if (args.count("tokenizer")) return args["tokenizer"].as<std::string>();
  const data::ChatOptions* chat = chat_options(loaded);
  if (chat && !chat->tokenizer.empty()) return chat->tokenizer;
  const std::string& dir = loaded.cfg.model.pretrained;
  std::error_code ec;
  const bool has =
      checkpoint::is_directory(dir) &&
      std::filesystem::is_regular_file(std::filesystem::path(dir) / "tokenizer.json", ec);
  return has ? dir : "";
}

// The tokenizer at `path`, whose ids the model's `vocabulary` must hold.
std::unique_ptr<data::BpeTokenizer> model_tokenizer(const std::string& path, int64_t vocabulary) {
  auto bpe = std::make_unique<data::BpeTokenizer>(load_tokenizer_or_usage(path));
  require_vocabulary_holds(vocabulary, bpe->vocab_size(), "--tokenizer " + path);
  return bpe;
}

// The prompt's tokens: the `tokenizer`'s (its tokenizer into `bpe`), else bytes; the model's
// `vocabulary` must hold them.
std::vector<int64_t> prompt_ids(const std::string& tokenizer, const std::string& text,
                                int64_t vocabulary, std::unique_ptr<data::BpeTokenizer>& bpe) {
  std::vector<int64_t> ids;
  if (!tokenizer.empty()) {
    bpe = model_tokenizer(tokenizer, vocabulary);
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

// What generate continues: the prompt's ids, the text printed before each sample (the prompt
// itself; nothing with --chat), the tokenizer (null: bytes) and the tokens drawn but not printed
// (--chat's end of the reply).
struct Prompt {
  std::vector<int64_t> ids;
  std::string echo;
  std::unique_ptr<data::BpeTokenizer> bpe;
  std::vector<int64_t> unprinted;
};

// The text to continue: the prompt as given, else a start as nanoGPT's sample.py has (a newline
// byte, or the tokenizer's bos: GPT-2's <|endoftext|>).
Prompt text_prompt(const cxxopts::ParseResult& args, const config::LoadedConfig& loaded,
                   int64_t vocabulary) {
  if (args.count("system")) throw UsageError("--system gives --chat's system message; add --chat");
  if (args.count("chat-template")) {
    throw UsageError("--chat-template gives --chat's format; add --chat");
  }
  const std::string given = prompt_text(args);
  const std::string tokenizer = tokenizer_path(args, loaded);
  Prompt p;
  p.echo = given.empty() && tokenizer.empty() ? "\n" : given;
  p.ids = prompt_ids(tokenizer, p.echo, vocabulary, p.bpe);
  return p;
}

// The folder holding the tokenizer at `path` (its tokenizer_config.json and chat template).
std::string tokenizer_folder(const std::string& path) {
  if (checkpoint::is_directory(path)) return path;
  const auto parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

// The chat format --chat renders in: --chat-template, else a chat run's data.chat_template, else
// "auto" (the tokenizer folder's template).
std::string chat_template_name(const cxxopts::ParseResult& args, const data::ChatOptions* run) {
  if (!args.count("chat-template")) return run ? run->chat_template : "auto";
  const std::string name = args["chat-template"].as<std::string>();
  if (!data::chat_format_named(name)) {
    throw UsageError("--chat-template: \"" + name + "\" is none of " +
                     join(data::chat_format_names(), "|"));
  }
  return name;
}

// --chat: [--system's message,] the prompt as a user message, rendered in the run's chat format
// with the generation prompt; the format's end-of-turn token joins `stops` (unless --ignore-eos)
// and is not printed.
Prompt chat_prompt(const cxxopts::ParseResult& args, const config::LoadedConfig& loaded,
                   int64_t vocabulary, std::vector<int64_t>& stops) {
  const std::string tokenizer = tokenizer_path(args, loaded);
  if (tokenizer.empty()) {
    throw UsageError(
        "generate --chat: no tokenizer to render the chat with; give --tokenizer "
        "(a Hugging Face model folder with its tokenizer_config.json) or use a run "
        "with model.pretrained: DIR");
  }
  Prompt p;
  p.bpe = model_tokenizer(tokenizer, vocabulary);
  const data::ChatOptions* run = chat_options(loaded);
  std::unique_ptr<data::ChatEncoder> encoder;
  try {
    const auto format =
        data::pick_chat_format(chat_template_name(args, run), tokenizer_folder(tokenizer));
    encoder = std::make_unique<data::ChatEncoder>(
        *p.bpe, format, data::chat_specials(*p.bpe, format, run ? run->chat_date : ""),
        data::TrainOn::assistant);
  } catch (const data::DataConfigError& e) {
    const std::string why = e.message().substr(0, e.message().find("; set data.chat_template"));
    throw UsageError("generate --chat: " + why + "; give --chat-template " +
                     join(data::chat_format_names(), "|") +
                     " (the format the model was trained in), or generate without --chat");
  } catch (const data::ChatEncodeError& e) {
    throw UsageError(std::string("generate --chat: ") + e.what());
  }
  std::vector<data::ChatMessage> messages;
  if (args.count("system")) messages.push_back({"system", args["system"].as<std::string>(), {}});
  messages.push_back({"user", prompt_text(args), {}});
  p.ids = encoder->generation_prompt(messages);
  const int64_t end = encoder->end_of_turn_id();
  if (end >= 0 && !args.count("ignore-eos")) stops.push_back(end);
  p.unprinted = stops;
  return p;
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
  const auto m = load_checkpoint_model(args, distributed::DistEnv{}, "generate",
                                       engine::LabelUse::none, /*needs_data=*/false);
  auto& trainer = *m.trainer;
  const std::string& checkpoint = m.checkpoint;
  const auto& loaded = m.loaded;
  sampling.stop_ids = stop_ids(args, loaded);
  auto decoder = trainer.decoder(/*use_cache=*/args.count("no-cache") == 0);
  if (!decoder) {
    throw UsageError("generate: " + checkpoint + " holds a " + loaded.cfg.model.name +
                     ", which is not a language model (gpt is)");
  }
  const Prompt p = args.count("chat")
                       ? chat_prompt(args, loaded, decoder->vocabulary(), sampling.stop_ids)
                       : text_prompt(args, loaded, decoder->vocabulary());
  std::string listed;
  for (const int64_t id : p.ids) listed += " " + std::to_string(id);
  log::debug(strprintf("generate: the prompt's %zu token ids:", p.ids.size()) + listed);
  const auto prompt =
      torch::tensor(p.ids, torch::kLong).view({1, -1}).to(trainer.device());  // [1, T]
  // Each token's bytes: the tokenizer's, or the bytes themselves.
  const auto bytes_of = [&](int64_t id) {
    if (std::find(p.unprinted.begin(), p.unprinted.end(), id) != p.unprinted.end())
      return std::string();
    if (!p.bpe) return std::string(1, static_cast<char>(id));
    return id < p.bpe->vocab_size() ? p.bpe->token_bytes(id) : std::string();
  };
  auto generator = at::detail::createCPUGenerator(sampling.seed);
  int64_t tokens = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t s = 0; s < args["num-samples"].as<int64_t>(); ++s) {
    if (s > 0) std::cout << "\n---\n";
    std::cout << p.echo << std::flush;
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
