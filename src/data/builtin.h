// Registration hooks of the built-in datasets, called once by dataset_registry().
#pragma once

#include "data/dataset.h"

namespace trainer::data {

void register_synthetic(DatasetRegistry& registry);
void register_fashion_mnist(DatasetRegistry& registry);
void register_cifar10(DatasetRegistry& registry);
void register_imagefolder(DatasetRegistry& registry);
void register_tokens(DatasetRegistry& registry);

}  // namespace trainer::data
