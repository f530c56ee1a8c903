// Replays inputs through the libFuzzer targets of this folder without libFuzzer or sanitizers, so that
// CI (GCC, no Clang) builds every harness and runs the seeds and the inputs that once found a defect
// (regressions/TARGET/) through them: ctest fuzz_replay (replay.sh). Each target's LLVMFuzzerTestOneInput
// is renamed TARGET_entry when built into this binary (tests/CMakeLists.txt), listed in fuzz_entries.inc.
// Usage: fuzz_replay TARGET PATH...   (a directory: every file in it, in name order)
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#define ROOFLINE_FUZZ_ENTRY(name) extern "C" int name##_entry(const uint8_t* data, size_t size);
#include "fuzz_entries.inc"
#undef ROOFLINE_FUZZ_ENTRY

namespace {

struct Entry {
  const char* name;
  int (*run)(const uint8_t*, size_t);
};

const Entry kEntries[] = {
#define ROOFLINE_FUZZ_ENTRY(name) {#name, name##_entry},
#include "fuzz_entries.inc"
#undef ROOFLINE_FUZZ_ENTRY
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: fuzz_replay TARGET PATH...\n");
    return 2;
  }
  const Entry* entry = nullptr;
  for (const Entry& e : kEntries)
    if (!std::strcmp(e.name, argv[1])) entry = &e;
  if (!entry) {
    std::fprintf(stderr, "fuzz_replay: no target %s\n", argv[1]);
    return 2;
  }
  std::vector<std::filesystem::path> files;
  for (int i = 2; i < argc; ++i) {
    const std::filesystem::path p = std::filesystem::absolute(argv[i]);  // a harness may change the directory (fuzz_cli)
    if (std::filesystem::is_directory(p)) {
      std::vector<std::filesystem::path> in_dir;
      for (const auto& f : std::filesystem::directory_iterator(p))
        if (f.is_regular_file()) in_dir.push_back(f.path());
      std::sort(in_dir.begin(), in_dir.end());
      files.insert(files.end(), in_dir.begin(), in_dir.end());
    } else if (std::filesystem::is_regular_file(p)) {
      files.push_back(p);
    } else {
      std::fprintf(stderr, "fuzz_replay: %s is neither a file nor a directory\n", argv[i]);
      return 2;
    }
  }
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::vector<uint8_t> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::fprintf(stderr, "%s %s (%zu bytes)\n", entry->name, f.c_str(), data.size());
    entry->run(data.data(), data.size());  // a defect aborts, with the reason on stderr
  }
  std::printf("%s: %zu inputs replayed\n", entry->name, files.size());
  return 0;
}
