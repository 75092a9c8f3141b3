#include "util/log.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <utility>

namespace trainer::log {
namespace {

constexpr const char* kFileLogger = "file";

// The lines logged before the run dir's file exists (the start-up: data, model, pretrained
// weights, warnings), written at the top of the file when it is added.
std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt>& early_lines() {
  static std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink;
  return sink;
}

std::string pattern(int rank) {
  return "[%Y-%m-%d %H:%M:%S.%e] [rank " + std::to_string(rank) + "] [%^%l%$] %v";
}

spdlog::level::level_enum to_spdlog(Level level) {
  switch (level) {
    case Level::trace:
      return spdlog::level::trace;
    case Level::debug:
      return spdlog::level::debug;
    case Level::info:
      return spdlog::level::info;
    case Level::warn:
      return spdlog::level::warn;
    case Level::error:
      return spdlog::level::err;
  }
  return spdlog::level::info;
}

}  // namespace

bool parse_level(const std::string& text, Level* level) {
  static const std::pair<const char*, Level> kLevels[] = {{"trace", Level::trace},
                                                          {"debug", Level::debug},
                                                          {"info", Level::info},
                                                          {"warn", Level::warn},
                                                          {"error", Level::error}};
  for (const auto& [name, value] : kLevels) {
    if (text == name) {
      *level = value;
      return true;
    }
  }
  return false;
}

void setup(Level level, int rank) {
  auto console = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>("trainer", console);
  logger->set_pattern(pattern(rank));
  logger->set_level(to_spdlog(level));
  logger->flush_on(spdlog::level::info);
  early_lines() = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(/*n_items=*/2000);
  early_lines()->set_pattern(pattern(rank));
  logger->sinks().push_back(early_lines());
  spdlog::set_default_logger(logger);
}

void add_file(const std::string& path, int rank) {
  auto logger = spdlog::default_logger();
  if (auto& early = early_lines()) {
    std::ofstream out(path, std::ios::app);
    for (const auto& line : early->last_formatted()) out << line;
    auto& sinks = logger->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), early), sinks.end());
    early.reset();
  }
  auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, /*truncate=*/false);
  file->set_pattern(pattern(rank));
  logger->sinks().push_back(file);
  auto file_logger = std::make_shared<spdlog::logger>(kFileLogger, file);
  file_logger->set_level(logger->level());
  file_logger->flush_on(spdlog::level::info);
  spdlog::drop(kFileLogger);
  spdlog::register_logger(file_logger);
}

void write(Level level, const std::string& line) {
  spdlog::log(to_spdlog(level), "{}", line);
}

void file_only(Level level, const std::string& line) {
  if (auto logger = spdlog::get(kFileLogger)) logger->log(to_spdlog(level), "{}", line);
}

}  // namespace trainer::log
