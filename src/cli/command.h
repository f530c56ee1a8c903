// Subcommand registry of the `roofline` binary. Each src/cli/cmd_*.cpp registers itself with
// `static const CommandRegistration reg{...}`; main.cpp lists and dispatches them.
#pragma once

#include <string>
#include <vector>

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

// Runs `body` and turns an Error into "error: message" on stderr and exit code 1.
int run_guarded(int (*body)(int, char**), int argc, char** argv);

}  // namespace roofline::cli
