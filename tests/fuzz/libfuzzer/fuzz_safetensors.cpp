// libFuzzer target: a safetensors file image (header and data) parsed, then every tensor it lists read
// as f32 in a few spans. Must parse or fail with roofline::Error; a tensor it returns must be readable.
#include <cstdint>
#include <vector>

#include "formats/safetensors.h"
#include "tests/fuzz/libfuzzer/fuzz_common.h"

using namespace roofline;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto tensors = safetensors::parse_safetensors("fuzz.safetensors", data, size);
    for (const auto& t : tensors) {
      const int64_t n = t.n_elements();
      float out[64];
      const int64_t first = n > 64 ? n - 64 : 0;
      if (n > 0) safetensors::tensor_to_f32(t, first, std::min<int64_t>(64, n), out);
    }
  } catch (const InternalError& e) {
    fuzz::defect("safetensors", e.what());
  } catch (const Error&) {
  } catch (const std::exception& e) {
    fuzz::defect("safetensors", e.what());
  }
  return 0;
}
