// Precompiled header for the targets built on LibTorch.
#pragma once

#include <torch/torch.h>
