// A `roofline` child process for tests that must not hang with it: started with posix_spawn (stdout
// on a pipe, stdin from a pipe or /dev/null, stderr into a file), waited for with a deadline, killed
// when it runs past it. run_cli (test_util.h) would wait forever for a hung command.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"

extern char** environ;

namespace roofline::test {

class CliProcess {
 public:
  // Starts `roofline ARGS`; with `stdin_text`, that text is written to its stdin (then closed).
  explicit CliProcess(const std::vector<std::string>& args, const std::optional<std::string>& stdin_text = std::nullopt) {
    err_path_ = temp_dir() + "/stderr";
    int out[2], in[2] = {-1, -1};
    if (pipe(out) != 0) return;
    if (stdin_text && pipe(in) != 0) return;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    posix_spawn_file_actions_addopen(&fa, 2, err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (stdin_text) {
      posix_spawn_file_actions_adddup2(&fa, in[0], 0);
      posix_spawn_file_actions_addclose(&fa, in[1]);
    } else {
      posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    }
    std::vector<std::string> all = {binary_path()};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
    close(out[1]);
    out_fd_ = out[0];
    if (stdin_text) {
      close(in[0]);
      std::thread([fd = in[1], text = *stdin_text] {
        size_t done = 0;
        while (done < text.size()) {
          const ssize_t n = write(fd, text.data() + done, text.size() - done);
          if (n <= 0) break;
          done += (size_t)n;
        }
        close(fd);
      }).detach();
    }
  }
  ~CliProcess() {
    if (pid_ > 0 && !status_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_fd_ >= 0) close(out_fd_);
  }
  CliProcess(const CliProcess&) = delete;
  CliProcess& operator=(const CliProcess&) = delete;

  bool started() const { return pid_ > 0; }
  void signal(int sig) { kill(pid_, sig); }

  // Reads stdout until a line containing `needle` arrives (true) or the time is up / stdout closes.
  bool wait_for_line(const std::string& needle, double seconds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    for (;;) {
      if (out_.find(needle) != std::string::npos) return true;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
      if (left <= 0 || !read_some((int)left)) return false;
    }
  }

  // Waits up to `seconds` for the exit: the wait status, or nullopt after killing a process that ran past it.
  std::optional<int> wait(double seconds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    for (;;) {
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        status_ = st;
        while (read_some(0)) {
        }
        return st;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
        status_ = -1;
        return std::nullopt;
      }
      if (!read_some(5)) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  const std::string& out() const { return out_; }
  std::string err() const {
    std::ifstream f(err_path_);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }

 private:
  bool read_some(int timeout_ms) {
    pollfd p{out_fd_, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) return false;
    char buf[4096];
    const ssize_t n = read(out_fd_, buf, sizeof buf);
    if (n <= 0) return false;
    out_.append(buf, (size_t)n);
    return true;
  }

  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::string err_path_;
  std::string out_;
  std::optional<int> status_;
};

}  // namespace roofline::test
