// Subcommand registry of the `roofline` binary. Each src/cli/cmd_*.cpp registers itself with
// `static const CommandRegistration reg{...}`; main.cpp lists and dispatches them.
#pragma once

#include <string>
#include <vector>

#include "core/error.h"

namespace CLI {
class App;
}

namespace roofline::cli {

using CommandFn = int (*)(int argc, char** argv);  // argv[0] is "roofline <name>"

struct Command {
  std::string name;
  std::string summary;
  CommandFn run;
  int order;  // position in `roofline --help` (the user's path: convert, quantize, plan, serve, bench, ...)
};

std::vector<Command>& command_registry();

struct CommandRegistration {
  CommandRegistration(const char* name, const char* summary, CommandFn run, int order) {
    command_registry().push_back({name, summary, run, order});
  }
};

// llama.cpp spells some long flags with one dash (-ngl, -ctk, -fa, -np, ...). CLI11 wants two, so
// commands rewrite argv through this table before parsing: {"-ngl", "--n-gpu-layers"}, ...
// Also splits "-ngl=5"-style forms. Unknown single-dash words are left alone.
std::vector<std::string> normalize_llama_flags(int argc, char** argv);

// The exit status of every command, as `roofline --help` and each command's --help state it.
inline constexpr const char* kExitStatusHelp =
    "Exit status: 0 success; 1 an error while running (a file or model that cannot be read or loaded, a value "
    "out of range, a failed step); 2 a usage error (an unknown command or flag, a missing argument, a value that "
    "is not of the flag's kind). A flag given twice takes its last value.";

// A command line that cannot be used as written (a missing argument, flags that exclude each other):
// exit status 2, like a parse error.
class UsageError : public Error {
 public:
  using Error::Error;
};
template <typename... Args>
[[noreturn]] inline void usage_fail(fmt::format_string<Args...> format, Args&&... args) {
  throw UsageError(fmt::format(format, std::forward<Args>(args)...));
}

// Parses argv with llama.cpp's single-dash spellings allowed; returns -1 to continue, else an exit code
// (0 after --help; 2 with one "error: ..." line for a command line that does not parse). A flag given
// twice takes its last value, as llama.cpp's (scripts append overrides).
int parse_args(CLI::App& app, int argc, char** argv);
// The same for an argv already normalized (program name first), e.g. after a command's own rewriting.
int parse_args(CLI::App& app, const std::vector<std::string>& args);

// The whole of a file a flag names (binary, as it is); a file that cannot be opened fails with
// "FLAG PATH: cannot open (reason)".
std::string read_file_or_fail(const std::string& path, const std::string& flag);

// Runs `body` and turns an Error into "error: message" on stderr and exit code 1 (2 for UsageError).
int run_guarded(int (*body)(int, char**), int argc, char** argv);

}  // namespace roofline::cli
