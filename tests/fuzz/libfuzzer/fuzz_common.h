// Shared by the libFuzzer targets of tests/fuzz/libfuzzer (scripts/fuzz.sh builds and runs them): what an
// input may end in. Input errors are the exceptions the callers turn into one line or an HTTP 400
// (roofline::Error, serve::ApiError, GrammarError, SchemaError, nlohmann's parse errors of the input
// itself); anything else escaping a target (InternalError, a type_error of our own code, std::out_of_range,
// a sanitizer report, a hang) is a defect, and abort() hands it to libFuzzer with the input.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>

#include "core/error.h"

namespace roofline::fuzz {

[[noreturn]] inline void defect(const char* where, const char* what) {
  std::fprintf(stderr, "DEFECT in %s: %s\n", where, what);
  std::abort();
}

// Splits the input at its first NUL: (before, after). No NUL: (all, "").
inline std::pair<std::string_view, std::string_view> split_at_nul(std::string_view in) {
  const size_t z = in.find('\0');
  if (z == std::string_view::npos) return {in, {}};
  return {in.substr(0, z), in.substr(z + 1)};
}

// A folder of this process's own under the temp directory, removed with the object (targets keep one
// as a function-local static, so it goes when the process exits normally).
class TempDir {
 public:
  explicit TempDir(const std::string& tag)
      : path_(std::filesystem::temp_directory_path() / ("roofline-" + tag + "-" + std::to_string(getpid()))) {
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace roofline::fuzz
