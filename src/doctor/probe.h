// Gathers the doctor's facts from this process and machine. Every probe is defensive: a missing
// driver library, an absent GPU or an erroring call leaves its fact unknown, never a crash.
#pragma once

#include "doctor/findings.h"

namespace trainer::doctor {

// `wants_cuda`: the config asks for a CUDA device (turns "no GPU" into a failure).
Facts probe(bool wants_cuda);

}  // namespace trainer::doctor
