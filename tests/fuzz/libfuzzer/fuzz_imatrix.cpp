// libFuzzer target: importance-matrix files as `quantize --imatrix` and `imatrix --in-file` read them
// (llama.cpp's GGUF imatrix format, or its legacy .dat, told apart by the magic). A file may be refused
// (roofline::Error: one line); one that loads gives the quantizer's per-column means, merges with
// itself, and is written in both formats and read back with every entry that holds counts. Anything else is a defect.
// Input: the file's bytes.
#include <cstdint>
#include <fstream>
#include <string>

#include "core/error.h"
#include "engine/imatrix.h"
#include "tests/fuzz/libfuzzer/fuzz_common.h"

using namespace roofline;

namespace {

const fuzz::TempDir& temp() {
  static const fuzz::TempDir dir("fuzz-imatrix");
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in = (temp().path() / "in.imatrix").string();
  {
    std::ofstream f(in, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), (std::streamsize)size);
  }
  Imatrix im;
  try {
    im = Imatrix::load(in);
  } catch (const Error&) {
    return 0;
  } catch (const std::exception& e) {
    fuzz::defect("Imatrix::load", e.what());
  }
  try {
    (void)im.importance(in);
    for (ImatrixFormat format : {ImatrixFormat::Gguf, ImatrixFormat::Dat}) {
      const std::string out = (temp().path() / (format == ImatrixFormat::Gguf ? "out.gguf" : "out.dat")).string();
      try {
        im.save(out, format);
      } catch (const Error&) {
        continue;  // e.g. a name too long for GGUF: said in one line
      }
      // What we wrote loads, and entries with data come back (both formats leave out entries nothing was
      // counted for, as llama.cpp does).
      Imatrix back;
      try {
        back = Imatrix::load(out);
      } catch (const Error& e) {
        fuzz::defect("loading what save wrote", e.what());
      }
      for (const auto& [name, e] : im.entries()) {
        bool counted = false;
        for (int64_t c : e.counts) counted |= c > 0;
        if (counted && !e.sums.empty() && !back.entries().count(name)) fuzz::defect("save + load", "an entry was lost");
      }
    }
    Imatrix twice;
    twice.merge(im);
    twice.merge(im);
    (void)twice.importance(in);
  } catch (const Error&) {
  } catch (const std::exception& e) {
    fuzz::defect("using the loaded imatrix", e.what());
  }
  return 0;
}
