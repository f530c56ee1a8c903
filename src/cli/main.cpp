// roofline: one binary, many subcommands. Dispatches to the registered command; --help lists them.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/gpu.h"
#include "cli/command.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "roofline_version.h"

namespace roofline::cli {

namespace {

void print_help(FILE* out) {
  auto commands = command_registry();
  std::sort(commands.begin(), commands.end(), [](const Command& a, const Command& b) { return a.order < b.order; });
  std::fprintf(out, "roofline %s: run large language models at the memory-bandwidth limit\n\n", ROOFLINE_VERSION);
  std::fprintf(out, "usage: roofline <command> [options]   (roofline <command> --help for its options)\n\ncommands:\n");
  for (const Command& c : commands) std::fprintf(out, "  %-12s %s\n", c.name.c_str(), c.summary.c_str());
  std::fprintf(out, "\nModels: -m FILE.gguf, or -m synthetic:SHAPE:MIX for a random model of a known shape\n");
  std::fprintf(out, "(roofline synth --list shows the shapes and mixes).\n\n%s\n", kExitStatusHelp);
}

}  // namespace
}  // namespace roofline::cli

namespace {

// A GPU listed twice in -dev/--device runs two -sm row ranks on one GPU, whose partial sums wait for each other
// on the device. With CUDA's lazy module loading, a rank's first use of a kernel can wait for the GPU to go idle
// while the other rank's sum waits for that rank: a hang. So such runs load every kernel at start (before
// anything initializes CUDA), unless CUDA_MODULE_LOADING is set already. Distinct GPUs are unaffected.
void load_kernels_eagerly_for_shared_gpus(int argc, char** argv) {
  const char* env = std::getenv("LLAMA_ARG_DEVICE");
  std::string value = env ? env : "";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "-dev" || arg == "--device") && i + 1 < argc) value = argv[i + 1];
    else if (arg.rfind("--device=", 0) == 0) value = arg.substr(9);
  }
  if (value.empty() || value == "none") return;
  std::vector<int> ids;
  try {
    ids = roofline::cli::parse_device_list(value);
  } catch (const roofline::Error&) {
    return;  // the command reports it
  }
  std::sort(ids.begin(), ids.end());
  if (std::adjacent_find(ids.begin(), ids.end()) != ids.end()) setenv("CUDA_MODULE_LOADING", "EAGER", 0);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace roofline::cli;
  load_kernels_eagerly_for_shared_gpus(argc, argv);
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    print_help(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;  // no command at all is a usage error
  }
  if (!std::strcmp(argv[1], "--version") || !std::strcmp(argv[1], "version")) {
    std::printf("roofline %s (commit %s)\n%s\n", ROOFLINE_VERSION, ROOFLINE_GIT_COMMIT, roofline::gpu_build_info().c_str());
    for (const auto& g : roofline::gpu_devices())
      std::printf("GPU %d: %s, compute capability %d.%d, %.1f GiB%s\n", g.index, g.name.c_str(), g.cc_major, g.cc_minor,
                  g.total_bytes / 1073741824.0,
                  !g.has_kernel_image ? " (no kernels for it in this build)"
                  : g.code_arch < 10 * g.cc_major + g.cc_minor ? (" (kernels run as sm_" + std::to_string(g.code_arch) + ")").c_str()
                                                                : "");
    return 0;
  }
  for (const Command& c : command_registry()) {
    if (c.name == argv[1]) {
      std::string program = std::string("roofline ") + argv[1];
      argv[1] = program.data();
      return c.run(argc - 1, argv + 1);
    }
  }
  std::fprintf(stderr, "error: unknown command '%s' (roofline --help lists the commands)\n", argv[1]);
  return 2;
}
