// Logging to stderr with a run-time level (FOUNDRY_LOG=debug|info|warning|error; default warning).
#pragma once

#include <cstdarg>

namespace foundry {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void set_log_level(LogLevel level);
LogLevel log_level();
bool log_enabled(LogLevel level);
void log_message(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace foundry

#define FOUNDRY_LOG(level, ...)                                                   \
  do {                                                                            \
    if (::foundry::log_enabled(::foundry::LogLevel::level)) ::foundry::log_message(::foundry::LogLevel::level, __VA_ARGS__); \
  } while (0)
#define LOG_DEBUG(...) FOUNDRY_LOG(kDebug, __VA_ARGS__)
#define LOG_INFO(...) FOUNDRY_LOG(kInfo, __VA_ARGS__)
#define LOG_WARNING(...) FOUNDRY_LOG(kWarning, __VA_ARGS__)
#define LOG_ERROR(...) FOUNDRY_LOG(kError, __VA_ARGS__)
