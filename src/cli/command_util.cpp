// Shared helpers of the subcommands: llama.cpp flag spellings, parsing (a repeated flag's last value
// wins; one-line errors, exit status 2) and the error guard (exit status 1, or 2 for usage errors).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <cerrno>
#include <exception>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "cli/command.h"
#include "core/error.h"

namespace roofline::cli {

std::vector<std::string> normalize_llama_flags(int argc, char** argv) {
  static const std::map<std::string, std::string> aliases = {
      {"-ngl", "--n-gpu-layers"}, {"-ctk", "--cache-type-k"}, {"-ctv", "--cache-type-v"},
      {"-fa", "--flash-attn"},    {"-np", "--parallel"},      {"-ub", "--ubatch-size"},
      {"-sm", "--split-mode"},    {"-ts", "--tensor-split"},  {"-mg", "--main-gpu"}, {"-dev", "--device"},
      {"-cb", "--cont-batching"}, {"-to", "--timeout"},       {"-npl", "--n-parallel"},
      {"-tb", "--threads-batch"}, {"-nkvo", "--no-kv-offload"}, {"-ot", "--override-tensor"},
      {"-fit", "--fit"},          {"-fitt", "--fit-target"},  {"-fitc", "--fit-ctx"},
      {"-sps", "--slot-prompt-similarity"}, {"-cram", "--cache-ram"}, {"-kvu", "--kv-unified"},
      {"-pg", "--prompt-gen"},    {"-nopo", "--no-op-offload"}, {"-mmp", "--mmap"},
      {"-cmoe", "--cpu-moe"},     {"-ncmoe", "--n-cpu-moe"},
      {"-md", "--model-draft"},   {"-ngld", "--gpu-layers-draft"},
  };
  std::vector<std::string> out;
  out.reserve(argc);
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (i > 0 && a.size() > 2 && a[0] == '-' && a[1] != '-') {
      const size_t eq = a.find('=');
      const std::string head = a.substr(0, eq);
      auto it = aliases.find(head);
      if (it != aliases.end()) {
        out.push_back(eq == std::string::npos ? it->second : it->second + a.substr(eq));
        continue;
      }
    }
    out.push_back(a);
  }
  return out;
}

namespace {

// CLI11's message as one line in roofline's words.
std::string parse_error_text(const CLI::ParseError& e) {
  std::string m = e.what();
  const std::string conv = "Could not convert: ";
  if (m.rfind(conv, 0) == 0) {  // "Could not convert: --ctx-size = 99999999999"
    const size_t eq = m.find(" = ", conv.size());
    if (eq != std::string::npos)
      m = fmt::format("{}: '{}' is not a valid value (not a number, or out of the range of its type)",
                      m.substr(conv.size(), eq - conv.size()), m.substr(eq + 3));
  }
  for (char& c : m)
    if (c == '\n') c = ' ';
  return m;
}

}  // namespace

int parse_args(CLI::App& app, const std::vector<std::string>& args) {
  // llama.cpp's habit: a flag given twice takes its last value (scripts append overrides). Options that
  // take lists (repeatable -m of bench, positionals) keep every value.
  for (CLI::Option* o : app.get_options())
    if (o->get_items_expected_max() < CLI::detail::expected_max_vector_size) o->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.footer(kExitStatusHelp);
  std::vector<const char*> cargs;
  for (auto& s : args) cargs.push_back(s.c_str());
  try {
    app.parse((int)cargs.size(), cargs.data());
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::fprintf(stderr, "error: %s; see %s --help\n", parse_error_text(e).c_str(),
                 args.empty() ? "roofline" : args[0].c_str());
    return 2;
  }
  return -1;
}

int parse_args(CLI::App& app, int argc, char** argv) { return parse_args(app, normalize_llama_flags(argc, argv)); }

std::vector<Command>& command_registry() {
  static std::vector<Command> commands;
  return commands;
}

int run_guarded(int (*body)(int, char**), int argc, char** argv) {
  try {
    return body(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const roofline::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory\n");
    return 1;
  } catch (const std::length_error&) {
    std::fprintf(stderr, "error: out of memory (a size beyond what this machine can allocate)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}

std::string read_file_or_fail(const std::string& path, const std::string& flag) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("{} {}: cannot open ({})", flag, path, std::strerror(errno));
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace roofline::cli
