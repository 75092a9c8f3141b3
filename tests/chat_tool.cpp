// Helper of tests/chat_check.py: the chat data set (data/tokens/chat.h) and the samples of a token
// data set, as the trainer builds them.
//
//   chat_tool OUT KEY=VALUE...
//
// KEY=VALUE sets data.KEY (name and root, or a data set's own key; true/false, integers and
// numbers typed as such), or the data context: seed, context_length, pretrained. For data.name
// chat (the default) OUT/conversations.jsonl gets one line per conversation of each split:
// {"split", "name" (FILE:LINE), "ids", "trained"}. OUT/samples.jsonl gets every sample of both
// splits in order: {"split", "index", "name", "inputs", "targets"} and "positions" when the batch
// has them; OUT/spec.json the data spec (seq_len, vocab). Exits 2 with "KEY: message" for a
// setting or record the data set rejects, 1 with the message for any other problem. dump=
// conversations writes conversations.jsonl alone (without building the samples).
//
//   chat_tool --serve
//
// runs one job a line of stdin, each a JSON array ["OUT", "KEY=VALUE", ...], in this one process
// (a LibTorch process takes half a second to start): the job's stderr goes to OUT/stderr.txt and
// its exit status, as above, to a line of stdout.
#include <torch/torch.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/tokens/chat.h"
#include "util/log.h"

namespace {

using namespace trainer;
using Json = nlohmann::json;

// Sets data.`key` from `value`, as the first type the key takes: bool, integer, number, string.
void set_option(config::DataConfig& cfg, const std::string& key, const std::string& value) {
  if (key == "name") {
    cfg.name = value;
    return;
  }
  if (key == "root") {
    cfg.root = value;
    return;
  }
  try {
    if (value == "true" || value == "false") return cfg.options.set(key, value == "true");
  } catch (const std::out_of_range&) {
  }
  try {
    size_t used = 0;
    const int64_t i = std::stoll(value, &used);
    if (used == value.size()) return cfg.options.set(key, i);
  } catch (const std::exception&) {
  }
  try {
    size_t used = 0;
    const double d = std::stod(value, &used);
    if (used == value.size()) return cfg.options.set(key, d);
  } catch (const std::exception&) {
  }
  cfg.options.set(key, value);
}

std::vector<int64_t> row(const torch::Tensor& t, int64_t i) {
  const auto r = t[i].contiguous();
  return std::vector<int64_t>(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
}

void dump_samples(const data::Dataset& d, const std::string& split, std::ofstream& out) {
  for (int64_t i = 0; i < d.size(); ++i) {
    const auto b = d.get({i});
    Json line = {{"split", split},
                 {"index", i},
                 {"name", d.sample_name(i)},
                 {"inputs", row(b.inputs, 0)},
                 {"targets", row(b.targets, 0)}};
    if (b.positions.defined()) line["positions"] = row(b.positions, 0);
    out << line.dump() << "\n";
  }
}

void dump_conversations(const data::ChatConversations& c, const std::string& split,
                        std::ofstream& out) {
  for (int64_t k = 0; k < c.size(); ++k) {
    const auto b = c.ids.begin() + c.offsets[k], e = c.ids.begin() + c.offsets[k + 1];
    const auto t = c.trained.begin() + c.offsets[k];
    Json line = {{"split", split},
                 {"name", c.name(k)},
                 {"ids", std::vector<int32_t>(b, e)},
                 {"trained", std::vector<int>(t, t + (e - b))}};
    out << line.dump() << "\n";
  }
}

// One job: OUT then KEY=VALUE settings; the exit status.
int run_job(const std::vector<std::string>& args) {
  try {
    if (args.empty()) throw std::invalid_argument("usage: chat_tool OUT KEY=VALUE...");
    const std::string dir = args[0];
    config::DataConfig cfg = data::default_data_config("chat");
    data::DataContext ctx;
    std::string dump = "all";
    for (size_t i = 1; i < args.size(); ++i) {
      const std::string& arg = args[i];
      const size_t eq = arg.find('=');
      if (eq == std::string::npos) throw std::invalid_argument("expected KEY=VALUE, got " + arg);
      const std::string key = arg.substr(0, eq), value = arg.substr(eq + 1);
      if (key == "dump") {
        dump = value;
      } else if (key == "seed") {
        ctx.seed = std::stoll(value);
      } else if (key == "context_length") {
        ctx.context_length = std::stoll(value);
      } else if (key == "pretrained") {
        ctx.pretrained = value;
      } else {
        set_option(cfg, key.rfind("data.", 0) == 0 ? key.substr(5) : key, value);
      }
    }
    if (cfg.name == "chat") {
      const auto chat = data::read_chat_data(cfg, ctx);
      std::ofstream out(dir + "/conversations.jsonl");
      dump_conversations(chat.train, "train", out);
      dump_conversations(chat.val, "val", out);
      if (dump == "conversations") return 0;
    }
    const auto splits = data::dataset_registry().get(cfg.name)(cfg, ctx);
    std::ofstream samples(dir + "/samples.jsonl");
    dump_samples(*splits.train, "train", samples);
    dump_samples(*splits.val, "val", samples);
    std::ofstream(dir + "/spec.json") << Json{
        {"seq_len", splits.spec.sample_shape.at(0)},
        {"vocab", splits.spec.num_classes}}.dump();
    return 0;
  } catch (const data::DataConfigError& e) {
    std::cerr << e.key() << ": " << e.message() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}

// --serve: a job a line of stdin, its stderr into OUT/stderr.txt, its status a line of stdout.
int serve() {
  const int saved = dup(STDERR_FILENO);
  for (std::string line; std::getline(std::cin, line);) {
    const auto args = Json::parse(line).get<std::vector<std::string>>();
    const std::string err_path = (args.empty() ? std::string(".") : args[0]) + "/stderr.txt";
    const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (err < 0 || dup2(err, STDERR_FILENO) < 0) return 1;
    close(err);
    const int code = run_job(args);
    std::cerr.flush();
    std::fflush(stderr);
    dup2(saved, STDERR_FILENO);
    std::cout << code << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  log::setup(log::Level::info, 0);
  if (argc == 2 && std::string(argv[1]) == "--serve") return serve();
  return run_job(std::vector<std::string>(argv + 1, argv + argc));
}
