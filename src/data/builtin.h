// Registration hooks of the built-in datasets, called once by dataset_registry().
#pragma once

#include "data/dataset.h"

namespace trainer::data {

void register_synthetic(DatasetRegistry& registry);
void register_fashion_mnist(DatasetRegistry& registry);

}  // namespace trainer::data
