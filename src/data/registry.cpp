#include "data/dataset.h"
#include "util/format.h"

namespace trainer::data {

// The built-in data sets, a line each: X(file) for the register_<file> function in
// src/data/<file>.cpp, which registers that file's data sets.
#define TRAINER_BUILTIN_DATASETS(X) \
  X(synthetic)                      \
  X(fashion_mnist)                  \
  X(cifar10)                        \
  X(imagefolder)                    \
  X(tokens)                         \
  X(webdataset)                     \
  X(mix)                            \
  X(chat)                           \
  X(preference)                     \
  X(token_rows)                     \
  /* end of the list */

using R = DatasetRegistry;
TRAINER_BUILTIN_DATASETS(TRAINER_DECLARE_REGISTER_FN)

const DatasetRegistry& dataset_registry() {
  static const auto registry =
      make_registry<DatasetRegistry>("dataset", {TRAINER_BUILTIN_DATASETS(TRAINER_REGISTER_FN)});
  return registry;
}

config::DataConfig default_data_config(const std::string& name) {
  config::DataConfig cfg;
  cfg.name = name;
  cfg.options = dataset_registry().options();
  return cfg;
}

void check_val_fraction(config::Checks& c, double fraction) {
  if (!(fraction > 0.0 && fraction < 1.0)) {
    c.add("val_fraction", "must be in (0, 1), got " + format_number(fraction));
  }
}

int64_t sequence_length(int64_t seq_len, const DataContext& ctx) {
  const int64_t n = seq_len > 0 ? seq_len : ctx.context_length;
  if (n < 1) {
    throw DataConfigError("data.seq_len",
                          "must be >= 1 (0 takes the model's context length, and this model has "
                          "none)");
  }
  return n;
}

}  // namespace trainer::data
