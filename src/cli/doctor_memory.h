// trainer doctor --config: the memory plan of a config's job (engine/measure/memory_plan.h)
// against the device it is planned for, with the cheapest changes that make it fit.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "doctor/findings.h"
#include "doctor/probe.h"

namespace trainer::cli {

// Where the job is planned for.
struct MemoryTarget {
  int64_t gpus = 0;      // processes (--gpus); 0: the launcher's world size, else the GPUs found
  int64_t gpu_mb = 0;    // each GPU's memory (--gpu-memory); 0: the smallest device found
  bool gpu_job = false;  // the job runs on GPUs (the config's device, or --gpu-memory)
};

// --gpu-memory's text ("80GB", "141GiB", "81920MiB"; util/format.h's parse_size) in MiB;
// UsageError naming the flag otherwise.
int64_t gpu_memory_mb(const std::string& text);

// The memory finding for the config at `config_path` with `sets` applied: the run is planned
// (its model on the meta device, engine::Build::plan), its step counted on meta tensors, and
// the plan per process printed against the capacity; `out` receives doctor --json's "memory".
doctor::Finding memory_finding(const std::string& config_path, std::vector<std::string> sets,
                               const doctor::Facts& facts, const MemoryTarget& target,
                               int64_t measure_batch, nlohmann::json& out);

}  // namespace trainer::cli
