#include "optim/schedule.h"

#include <algorithm>
#include <cmath>

namespace trainer::optim {
namespace {

constexpr double kPi = 3.14159265358979323846;

// Fraction of the decay phase done at t, in [0, 1].
double progress(int64_t t, int64_t decay_steps) {
  if (decay_steps <= 0) return 1.0;
  return std::clamp(static_cast<double>(t) / static_cast<double>(decay_steps), 0.0, 1.0);
}

}  // namespace

const ScheduleRegistry& schedule_registry() {
  static const ScheduleRegistry registry = [] {
    ScheduleRegistry r("scheduler");
    r.add("constant", [](const config::SchedConfig&, double base, int64_t) -> Decay {
      return [base](int64_t) { return base; };
    });
    // base * gamma^floor(t / step_size)
    r.add("step", [](const config::SchedConfig& cfg, double base, int64_t) -> Decay {
      return [base, gamma = cfg.gamma, size = cfg.step_size](int64_t t) {
        return base * std::pow(gamma, static_cast<double>(t / size));
      };
    });
    // base * gamma^(number of milestones <= t)
    r.add("multistep", [](const config::SchedConfig& cfg, double base, int64_t) -> Decay {
      return [base, gamma = cfg.gamma, milestones = cfg.milestones](int64_t t) {
        const auto passed =
            std::upper_bound(milestones.begin(), milestones.end(), t) - milestones.begin();
        return base * std::pow(gamma, static_cast<double>(passed));
      };
    });
    // min + (base - min) * (1 + cos(pi * t / T)) / 2
    r.add("cosine", [](const config::SchedConfig& cfg, double base, int64_t steps) -> Decay {
      return [base, min = cfg.min_lr, steps](int64_t t) {
        return min + (base - min) * 0.5 * (1.0 + std::cos(kPi * progress(t, steps)));
      };
    });
    // base + (min - base) * t / T
    r.add("linear", [](const config::SchedConfig& cfg, double base, int64_t steps) -> Decay {
      return [base, min = cfg.min_lr, steps](int64_t t) {
        return base + (min - base) * progress(t, steps);
      };
    });
    return r;
  }();
  return registry;
}

Schedule::Schedule(const config::SchedConfig& cfg, double base_lr, int64_t total_steps)
    : base_lr_(base_lr),
      warmup_steps_(cfg.warmup_steps),
      warmup_start_factor_(cfg.warmup_start_factor),
      decay_(schedule_registry().get(cfg.name)(
          cfg, base_lr, std::max<int64_t>(total_steps - cfg.warmup_steps, 0))) {}

double Schedule::lr(int64_t step) const {
  if (step < warmup_steps_) {
    const double frac = static_cast<double>(step + 1) / static_cast<double>(warmup_steps_);
    return base_lr_ * (warmup_start_factor_ + (1.0 - warmup_start_factor_) * frac);
  }
  return decay_(step - warmup_steps_);
}

}  // namespace trainer::optim
