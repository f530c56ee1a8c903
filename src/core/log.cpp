// Implementation of the stderr logger; one write per line so concurrent lines do not interleave.
#include "core/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace roofline {
namespace {

LogLevel level_from_env() {
  const char* env = std::getenv("ROOFLINE_LOG");
  if (!env) return LogLevel::Info;
  if (!std::strcmp(env, "error")) return LogLevel::Error;
  if (!std::strcmp(env, "warn")) return LogLevel::Warn;
  if (!std::strcmp(env, "debug")) return LogLevel::Debug;
  return LogLevel::Info;
}

std::atomic<int>& level_storage() {
  static std::atomic<int> level{(int)level_from_env()};
  return level;
}

}  // namespace

LogLevel log_level() { return (LogLevel)level_storage().load(std::memory_order_relaxed); }
void set_log_level(LogLevel level) { level_storage().store((int)level); }

void log_write(LogLevel level, std::string_view message) {
  static std::mutex mutex;
  static const char* const prefixes[] = {"error: ", "warning: ", "", "debug: "};
  std::string line = std::string(prefixes[(int)level]) + std::string(message) + "\n";
  std::lock_guard<std::mutex> lock(mutex);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace roofline
