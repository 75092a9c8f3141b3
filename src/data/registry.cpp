#include "data/builtin.h"
#include "data/dataset.h"

namespace trainer::data {

const DatasetRegistry& dataset_registry() {
  static const DatasetRegistry registry = [] {
    DatasetRegistry r("dataset");
    register_synthetic(r);
    register_fashion_mnist(r);
    register_cifar10(r);
    register_imagefolder(r);
    register_tokens(r);
    return r;
  }();
  return registry;
}

}  // namespace trainer::data
