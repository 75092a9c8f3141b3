// Helper of tests/dpo_check.py: the preference data set (data/tokens/preference.h) as the trainer
// builds it.
//
//   preference_tool OUT KEY=VALUE...
//
// KEY=VALUE sets data.KEY (files, val_files, max_length, tokenizer, chat_template, ...; integers
// typed as such) or the data context's pretrained. OUT/pairs.jsonl gets one line per training
// pair: {"index", "name" (FILE:LINE), "inputs", "targets"}, the pair's batch of two rows
// [chosen, rejected] as the data set's get({index}) makes it. Exits 2 with "KEY: message" for a
// setting or record the data set rejects, 1 for any other problem.
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "util/log.h"

namespace {

using namespace trainer;

std::vector<std::vector<int64_t>> rows(const torch::Tensor& t) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t i = 0; i < t.size(0); ++i) {
    const auto r = t[i].contiguous();
    out.emplace_back(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  log::setup(log::Level::warn, 0);
  try {
    if (argc < 2) throw std::invalid_argument("usage: preference_tool OUT KEY=VALUE...");
    config::DataConfig cfg = data::default_data_config("preference");
    data::DataContext ctx;
    for (int i = 2; i < argc; ++i) {
      const std::string arg = argv[i];
      const size_t eq = arg.find('=');
      if (eq == std::string::npos) throw std::invalid_argument("expected KEY=VALUE, got " + arg);
      const std::string key = arg.substr(0, eq), value = arg.substr(eq + 1);
      if (key == "pretrained") {
        ctx.pretrained = value;
      } else if (key == "max_length") {
        cfg.options.set(key, static_cast<int64_t>(std::stoll(value)));
      } else {
        cfg.options.set(key, value);
      }
    }
    const auto splits = data::dataset_registry().get(cfg.name)(cfg, ctx);
    std::ofstream out(std::string(argv[1]) + "/pairs.jsonl");
    for (int64_t i = 0; i < splits.train->size(); ++i) {
      const auto b = splits.train->get({i});
      const nlohmann::json line = {{"index", i},
                                   {"name", splits.train->sample_name(i)},
                                   {"inputs", rows(b.inputs)},
                                   {"targets", rows(b.targets)}};
      out << line.dump() << "\n";
    }
    return 0;
  } catch (const data::DataConfigError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
