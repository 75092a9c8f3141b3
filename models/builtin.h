// Registration functions of the built-in models, called once by model_registry().
#pragma once

#include "models/model.h"

namespace trainer::models {

void register_mlp(ModelRegistry& registry);
void register_lenet(ModelRegistry& registry);
void register_gpt(ModelRegistry& registry);
void register_resnet(ModelRegistry& registry);

}  // namespace trainer::models
