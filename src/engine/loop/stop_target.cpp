#include "engine/loop/stop_target.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "util/format.h"

namespace trainer::engine {
namespace {

const auto kStaticInit = std::chrono::steady_clock::now();

// The seconds since boot at which this process started (field 22 of /proc/self/stat, in clock
// ticks), and the seconds since boot now (/proc/uptime); nullopt where /proc has neither.
std::optional<double> proc_seconds_since_start() {
  std::ifstream stat("/proc/self/stat"), uptime("/proc/uptime");
  std::string text;
  double now = 0.0;
  if (!std::getline(stat, text) || !(uptime >> now)) return std::nullopt;
  // The command name (field 2) is in parentheses and may hold spaces: count after its end.
  const auto close = text.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(text.substr(close + 2));
  std::string field;
  for (int i = 3; i < 22; ++i) fields >> field;  // to starttime, field 22
  long long ticks = 0;
  if (!(fields >> ticks)) return std::nullopt;
  const long per_second = sysconf(_SC_CLK_TCK);
  if (per_second <= 0) return std::nullopt;
  return now - static_cast<double>(ticks) / static_cast<double>(per_second);
}

}  // namespace

bool StopTarget::reached_by(double value) const {
  return value <= below || value >= above;  // NaN compares false: an unset bound never reaches
}

std::string StopTarget::describe() const {
  return std::isnan(below) ? metric + " >= " + format_number(above)
                           : metric + " <= " + format_number(below);
}

std::vector<StopTarget> stop_targets(const config::TrainConfig& train) {
  std::vector<StopTarget> targets;
  if (train.stop_at.enabled()) {
    targets.push_back(
        {"train.stop_at", train.stop_at.metric, train.stop_at.below, train.stop_at.above});
  }
  if (train.stop_at_top1 > 0.0) {
    StopTarget top1{"train.stop_at_top1", "val/top1"};
    top1.above = train.stop_at_top1;
    targets.push_back(top1);
  }
  return targets;
}

std::optional<double> eval_metric(const std::string& name, const EvalResult& val,
                                  const EvalResult* ema) {
  const auto slash = name.find('/');
  if (slash == std::string::npos) return std::nullopt;
  const std::string split = name.substr(0, slash), field = name.substr(slash + 1);
  const EvalResult* e = split == "val" ? &val : split == "val_ema" ? ema : nullptr;
  if (!e || e->samples == 0) return std::nullopt;
  if (field == "loss") return e->loss;
  if (e->sequence) {
    if (field == "ppl") return e->ppl;
  } else if (field == "top1") {
    return e->top1;
  } else if (field == "top5") {
    return e->top5;
  }
  return std::nullopt;
}

void check_stop_target(const config::LoadedConfig& loaded, bool sequence) {
  const std::string& metric = loaded.cfg.train.stop_at.metric;
  if (metric.empty()) return;
  const std::string field = metric.substr(metric.find('/') + 1);
  const bool pairs = loaded.cfg.train.objective != "supervised";  // dpo: the objective's loss
  const bool has = field == "loss" || (!pairs && (sequence ? field == "ppl" : field != "ppl"));
  if (has) return;
  const std::string key = "train.stop_at.metric";
  const std::string gives = pairs      ? "train.objective do not give (they give loss)"
                            : sequence ? "language model do not give (they give loss and ppl)"
                                       : "model do not give (they give loss, top1 and top5)";
  throw config::ConfigError({config::Issue{
      loaded.where(key), key,
      "is '" + metric + "', which the evaluations of this " + gives + "; choose one of those"}});
}

double seconds_since_process_start() {
  if (const auto s = proc_seconds_since_start(); s && *s >= 0.0) return *s;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - kStaticInit).count();
}

}  // namespace trainer::engine
