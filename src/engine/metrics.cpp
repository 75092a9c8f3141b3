#include "engine/metrics.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "util/fileio.h"
#include "util/format.h"

namespace trainer::engine {

MetricsWriter::MetricsWriter(const std::string& run_dir, bool tensorboard, int64_t resume_step,
                             bool evaluated_at_resume) {
  const auto path = std::filesystem::path(run_dir) / "metrics.jsonl";
  if (resume_step >= 0) {
    // Lines past the checkpoint's step will be written again by the resumed run.
    std::string kept;
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      try {
        const auto j = nlohmann::json::parse(line);
        const int64_t step = j.at("step").get<int64_t>();
        const bool val = j.at("split").get<std::string>() == "val";
        if (step < resume_step || (step == resume_step && (!val || evaluated_at_resume))) {
          kept += line + "\n";
        }
      } catch (const nlohmann::json::exception&) {
        // A line cut short by a crash.
      }
    }
    write_text_atomically(path.string(), kept);
  }
  out_.open(path, std::ios::out | (resume_step >= 0 ? std::ios::app : std::ios::trunc));
  if (!out_) throw std::runtime_error(path.string() + ": cannot open for writing");
  if (tensorboard) {
    events_ = std::make_unique<tensorboard::EventWriter>(
        (std::filesystem::path(run_dir) / "tb").string());
  }
}

MetricsWriter::~MetricsWriter() = default;

void MetricsWriter::write(const nlohmann::json& record) {
  out_ << record.dump() << '\n';
  out_.flush();
  if (!out_) throw std::runtime_error("writing metrics failed (disk full?)");
  if (!events_) return;
  const double wall_time =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string split = record.at("split").get<std::string>();
  const int64_t step = record.at("step").get<int64_t>();
  for (const auto& [key, value] : record.items()) {
    if (key == "split" || key == "step" || key == "epoch" || !value.is_number()) continue;
    const std::string tag = key == "lr" ? key : split + "/" + key;
    events_->scalar(tag, value.get<double>(), step, wall_time);
  }
}

Progress::Progress(const std::string& mode)
    : active_(mode == "always" || (mode == "auto" && isatty(STDERR_FILENO))) {}

void Progress::update(int64_t step, int64_t total_steps, int64_t epoch, double loss,
                      double samples_per_sec, double eta_seconds) {
  if (!active_) return;
  const auto now = std::chrono::steady_clock::now();
  if (step != total_steps && drawn_ && now - last_draw_ < std::chrono::milliseconds(200)) return;
  last_draw_ = now;
  constexpr int kWidth = 24;
  const double frac = total_steps > 0 ? static_cast<double>(step) / total_steps : 0.0;
  const int filled = static_cast<int>(std::lround(frac * kWidth));
  std::string bar(filled, '#');
  bar.resize(kWidth, '.');
  // Before the first log line there is no loss to show yet.
  const std::string loss_text = std::isfinite(loss) ? strprintf("%.4f", loss) : "-";
  std::fprintf(stderr, "\r\033[Kepoch %lld [%s] %lld/%lld loss %s %.0f samples/s ETA %s",
               static_cast<long long>(epoch), bar.c_str(), static_cast<long long>(step),
               static_cast<long long>(total_steps), loss_text.c_str(), samples_per_sec,
               format_duration(eta_seconds).c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::clear() {
  if (!active_ || !drawn_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  drawn_ = false;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) seconds = 0;
  const auto total = static_cast<long long>(std::llround(seconds));
  const long long h = total / 3600, m = (total / 60) % 60, s = total % 60;
  char buf[32];
  if (h > 0) {
    std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", h, m, s);
  } else {
    std::snprintf(buf, sizeof(buf), "%lld:%02lld", m, s);
  }
  return buf;
}

}  // namespace trainer::engine
