// Helpers shared by the tests: where ../shared and the built binary are, error metrics, running the CLI.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace roofline::test {

// ../shared beside the checkout ("" when absent).
std::string shared_dir();
// Path under ../shared; the calling test is skipped (with a message) when ../shared is absent.
#define ROOFLINE_SHARED_PATH_OR_SKIP(var, relative)                           \
  std::string var = ::roofline::test::shared_dir();                           \
  if (var.empty()) GTEST_SKIP() << "../shared is absent; skipping " relative; \
  var += "/" relative

std::string source_dir();  // the checkout (ROOFLINE_SOURCE_DIR overrides the one the tests were built in)
std::string binary_path();  // the `roofline` executable
// A fresh temporary directory for one test, under a directory of the process removed when it exits.
std::string temp_dir();

// Normalised mean squared error sum((a-b)^2) / sum(b^2), accumulated in double.
double nmse(const float* a, const float* b, size_t n);
double max_abs_diff(const float* a, const float* b, size_t n);

struct CommandResult {
  int exit_code;
  std::string out;  // stdout
  std::string err;  // stderr
};
// Runs `roofline ARGS` (args are shell-quoted here) and captures its output.
CommandResult run_cli(const std::vector<std::string>& args);

// Decompresses an .xz file from ../shared into the temp dir (once per process) and returns its path.
std::string unxz_to_temp(const std::string& xz_path);

}  // namespace roofline::test
