// Shared helpers of the subcommands: llama.cpp flag spellings and the error guard.
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <string>

#include "cli/command.h"
#include "core/error.h"

namespace roofline::cli {

std::vector<std::string> normalize_llama_flags(int argc, char** argv) {
  static const std::map<std::string, std::string> aliases = {
      {"-ngl", "--n-gpu-layers"}, {"-ctk", "--cache-type-k"}, {"-ctv", "--cache-type-v"},
      {"-fa", "--flash-attn"},    {"-np", "--parallel"},      {"-ub", "--ubatch-size"},
      {"-sm", "--split-mode"},    {"-ts", "--tensor-split"},  {"-mg", "--main-gpu"},
      {"-cb", "--cont-batching"}, {"-to", "--timeout"},       {"-npl", "--n-parallel"},
      {"-tb", "--threads-batch"}, {"-nkvo", "--no-kv-offload"}, {"-ot", "--override-tensor"},
      {"-fit", "--fit"},          {"-fitt", "--fit-target"},  {"-fitc", "--fit-ctx"},
      {"-sps", "--slot-prompt-similarity"}, {"-cram", "--cache-ram"}, {"-kvu", "--kv-unified"},
      {"-pg", "--prompt-gen"},    {"-nopo", "--no-op-offload"}, {"-mmp", "--mmap"},
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

int run_guarded(int (*body)(int, char**), int argc, char** argv) {
  try {
    return body(argc, argv);
  } catch (const roofline::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}

}  // namespace roofline::cli
