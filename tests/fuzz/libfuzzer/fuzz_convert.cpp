// libFuzzer target: `roofline convert` of a Hugging Face folder whose config.json says something odd.
// The folders are the transformers fixtures of tests/fixtures (llama, qwen2, qwen3, Qwen3.5 with and
// without the vision tower, the MoE models, Gemma 3), found through $ROOFLINE_FUZZ_FIXTURES
// (scripts/fuzz.sh and replay.sh set it); the input is a config.json put beside a fixture's weights and
// tokenizer. A conversion may be refused (roofline::Error: one line); a file it writes must load and
// run a few tokens on the CPU, or be refused by the loader with an Error. Anything else is a defect.
// Input: byte 0 picks the fixture, the rest is config.json.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "convert/convert.h"
#include "core/error.h"
#include "model/model.h"
#include "model/model_file.h"
#include "tests/fuzz/libfuzzer/fuzz_common.h"
#include "tests/fuzz/libfuzzer/fuzz_engine.h"

using namespace roofline;
namespace fs = std::filesystem;

namespace {

// One working folder per fixture: links to its files but config.json, which each input writes.
const std::vector<std::string>& folders() {
  static const std::vector<std::string> all = [] {
    const char* root = std::getenv("ROOFLINE_FUZZ_FIXTURES");
    if (!root) fuzz::defect("setup", "ROOFLINE_FUZZ_FIXTURES is not set (scripts/fuzz.sh sets it)");
    std::vector<fs::path> sources;
    for (const char* sub : {"hf", "gemma3"})
      for (const auto& d : fs::directory_iterator(fs::path(root) / sub))
        if (fs::exists(d.path() / "model.safetensors")) sources.push_back(d.path());
    if (sources.empty()) fuzz::defect("setup", "no fixture folders under ROOFLINE_FUZZ_FIXTURES");
    std::sort(sources.begin(), sources.end());
    static const fuzz::TempDir temp("fuzz-convert");
    const fs::path& work = temp.path();
    std::vector<std::string> out;
    for (const auto& src : sources) {
      const fs::path dir = work / src.filename();
      fs::create_directories(dir);
      for (const auto& f : fs::directory_iterator(src)) {
        const std::string name = f.path().filename().string();
        if (name == "config.json" || fs::exists(dir / name)) continue;
        fs::create_symlink(fs::absolute(f.path()), dir / name);
      }
      out.push_back(dir.string());
    }
    return out;
  }();
  return all;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto& all = folders();
  const std::string& dir = all[data[0] % all.size()];
  {
    std::ofstream f(dir + "/config.json", std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data) + 1, (std::streamsize)(size - 1));
  }
  convert::ConvertOptions o;
  o.source = dir;
  o.output = dir + ".gguf";
  o.n_threads = 1;
  o.progress = false;
  try {
    convert::convert_model(o);
  } catch (const Error&) {
    return 0;
  } catch (const std::exception& e) {
    fuzz::defect("convert", e.what());
  }
  try {
    fuzz::run_a_few_tokens(Model::load(open_model_file(o.output)));
  } catch (const Error&) {
  } catch (const std::exception& e) {
    fuzz::defect("loading or running the converted file", e.what());
  }
  return 0;
}
