// Implementation of the shared test helpers.
#include "test_util.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

namespace roofline::test {

namespace {
bool exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}
std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'') q += "'\\''";
    else q += c;
  }
  return q + "'";
}
}  // namespace

std::string shared_dir() {
  if (const char* env = std::getenv("ROOFLINE_SHARED_DIR")) return exists(env) ? env : "";
  return exists(ROOFLINE_SHARED_DIR) ? ROOFLINE_SHARED_DIR : "";
}

// ROOFLINE_SOURCE_DIR in the environment wins: binaries built here run from another checkout on the GPU
// machine.
std::string source_dir() {
  if (const char* env = std::getenv("ROOFLINE_SOURCE_DIR")) return env;
  return ROOFLINE_SOURCE_DIR;
}
std::string binary_path() { return ROOFLINE_BINARY; }

std::string temp_dir() {
  static std::mutex mutex;
  static std::string base;
  static int counter = 0;
  std::lock_guard<std::mutex> lock(mutex);
  if (base.empty()) {
    char tmpl[] = "/tmp/roofline-test-XXXXXX";
    const char* d = ::mkdtemp(tmpl);
    base = d ? d : "/tmp";
    // One directory per test process (ctest runs every test in its own): removed when the process
    // exits, so a full suite does not leave gigabytes in /tmp (ROOFLINE_KEEP_TEST_TMP=1 keeps it).
    // Only by the process that made it (a forked child that calls exit() leaves it alone).
    static pid_t owner = ::getpid();
    if (d && !std::getenv("ROOFLINE_KEEP_TEST_TMP"))
      std::atexit([] {
        if (::getpid() != owner) return;
        std::error_code ec;
        std::filesystem::remove_all(base, ec);
      });
  }
  std::string dir = base + "/t" + std::to_string(counter++);
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

double nmse(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = (double)a[i] - (double)b[i];
    num += d * d;
    den += (double)b[i] * (double)b[i];
  }
  return den > 0 ? num / den : num;
}

double max_abs_diff(const float* a, const float* b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs((double)a[i] - (double)b[i]));
  return m;
}

CommandResult run_cli(const std::vector<std::string>& args) {
  const std::string dir = temp_dir();
  std::string cmd = shell_quote(binary_path());
  for (const auto& a : args) cmd += " " + shell_quote(a);
  cmd += " >" + dir + "/out 2>" + dir + "/err </dev/null";
  const int status = std::system(cmd.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  r.out = read_all(dir + "/out");
  r.err = read_all(dir + "/err");
  return r;
}

std::string unxz_to_temp(const std::string& xz_path) {
  static std::mutex mutex;
  static std::map<std::string, std::string> done;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = done.find(xz_path);
  if (it != done.end()) return it->second;
  std::string name = xz_path.substr(xz_path.find_last_of('/') + 1);
  name = name.substr(0, name.size() - 3);
  const std::string out = temp_dir() + "/" + name;
  const std::string cmd = "xz -dc " + shell_quote(xz_path) + " > " + shell_quote(out);
  if (std::system(cmd.c_str()) != 0) return "";
  done[xz_path] = out;
  return out;
}

}  // namespace roofline::test
