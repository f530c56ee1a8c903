// Minimal leveled logging to stderr. Level from ROOFLINE_LOG (error|warn|info|debug), default info.
#pragma once

#include <fmt/format.h>

#include <string_view>

namespace roofline {

enum class LogLevel { Error = 0, Warn = 1, Info = 2, Debug = 3 };

LogLevel log_level();
void set_log_level(LogLevel level);
void log_write(LogLevel level, std::string_view message);

template <typename... Args>
void log_info(fmt::format_string<Args...> format, Args&&... args) {
  if (log_level() >= LogLevel::Info) log_write(LogLevel::Info, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> format, Args&&... args) {
  if (log_level() >= LogLevel::Warn) log_write(LogLevel::Warn, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void log_error(fmt::format_string<Args...> format, Args&&... args) {
  log_write(LogLevel::Error, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void log_debug(fmt::format_string<Args...> format, Args&&... args) {
  if (log_level() >= LogLevel::Debug) log_write(LogLevel::Debug, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace roofline
