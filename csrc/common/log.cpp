#include "common/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace foundry {
namespace {

LogLevel parse_level(const char* text) {
  if (text == nullptr) return LogLevel::kWarning;
  if (std::strcmp(text, "debug") == 0) return LogLevel::kDebug;
  if (std::strcmp(text, "info") == 0) return LogLevel::kInfo;
  if (std::strcmp(text, "error") == 0) return LogLevel::kError;
  return LogLevel::kWarning;
}

std::atomic<int>& level_slot() {
  static std::atomic<int> level{static_cast<int>(parse_level(std::getenv("FOUNDRY_LOG")))};
  return level;
}

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "DEBUG";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kWarning: return "WARNING";
    case LogLevel::kError: return "ERROR";
  }
  return "?";
}

}  // namespace

void set_log_level(LogLevel level) { level_slot().store(static_cast<int>(level)); }
LogLevel log_level() { return static_cast<LogLevel>(level_slot().load()); }
bool log_enabled(LogLevel level) { return static_cast<int>(level) >= level_slot().load(); }

void log_message(LogLevel level, const char* fmt, ...) {
  char body[1024];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(body, sizeof(body), fmt, args);
  va_end(args);
  // One write per line so lines from several threads or processes do not interleave.
  char line[1200];
  int n = std::snprintf(line, sizeof(line), "[foundry %s pid=%d] %s\n", level_name(level), getpid(), body);
  if (n > 0) {
    ssize_t ignored = write(STDERR_FILENO, line, static_cast<size_t>(n) < sizeof(line) ? n : sizeof(line) - 1);
    (void)ignored;
  }
}

}  // namespace foundry
