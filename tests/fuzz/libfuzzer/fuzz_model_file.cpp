// libFuzzer target: a model file that parses as GGUF but says something odd (a head count, a layer
// count, a window, an expert count, a tensor's shape or type, a missing or renamed tensor), loaded and
// run on the CPU: a prompt of a few tokens, then one decode step; when the input asks, quantized first
// (`roofline quantize` with one of five mixes) and the quantized file run instead. The file is one of the tiny
// synthetic models of every architecture, edited as the input says, written out as GGUF and parsed
// back from memory (the path a downloaded file takes). Loading may refuse it (roofline::Error: one
// line naming the problem); a model that loads must run. Anything else (another exception, a sanitizer
// report, a hang) is a defect.
// Input: byte 0 picks the model (byte 0 % 7) and the mix (byte 0 / 16: 11 Q4_K_M, 12 Q8_0, 13 Q2_K,
// 14 IQ4_XS, else none: quantizing is most of an input's time); then records of 8 bytes: op, a, b,
// c0..c4 (see apply_edit).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/gguf.h"
#include "model/model.h"
#include "model/model_file.h"
#include "model/quant_mix.h"
#include "model/quantize.h"
#include "tests/fuzz/libfuzzer/fuzz_common.h"
#include "tests/fuzz/libfuzzer/fuzz_engine.h"

using namespace roofline;

namespace {

struct Base {
  std::shared_ptr<gguf::GgufFile> file;
};

const std::vector<Base>& bases() {
  static const std::vector<Base> all = [] {
    std::vector<Base> out;
    for (const char* spec : {"synthetic:tiny-qwen3:F32", "synthetic:tiny-llama:Q8_0", "synthetic:tiny-gemma3:F32",
                             "synthetic:tiny-qwen35:F32", "synthetic:tiny-qwen3moe:F32", "synthetic:tiny-qwen35moe:Q8_0",
                             "synthetic:tiny-qwen2:Q4_K_M"}) {
      ModelFileOptions o;
      o.n_threads = 1;
      out.push_back({open_model_file(spec, o)});
    }
    return out;
  }();
  return all;
}

constexpr DType kTypes[] = {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_K,
                            DType::Q5_K, DType::Q6_K, DType::Q2_K, DType::Q3_K, DType::IQ4_XS};

int32_t int_of(const uint8_t* c) {
  int32_t v;
  std::memcpy(&v, c, 4);
  return v;
}

// One edit. op 0: key a := integer c (i32, or u32 when b is odd); 1: key a := float c; 2: erase key a;
// 3: tensor a's dimension b := c0 + 256 c1; 4: tensor a's type := kTypes[b]; 5: drop tensor a;
// 6: swap the names of tensors a and b; 7: key a := an array of b % 70 integers c0 (or strings when c1 is odd).
void apply_edit(const uint8_t* r, gguf::Metadata& md, std::vector<gguf::TensorInfo>& tensors) {
  const uint8_t op = r[0] % 8, a = r[1], b = r[2];
  const uint8_t* c = r + 3;
  const auto& entries = md.entries();
  const std::string key = entries.empty() ? std::string("general.architecture") : entries[a % entries.size()].first;
  switch (op) {
    case 0:
      md.set(key, b & 1 ? gguf::Value::u32((uint32_t)int_of(c)) : gguf::Value::i32(int_of(c)));
      break;
    case 1: {
      float f;
      std::memcpy(&f, c, 4);
      md.set(key, gguf::Value::f32(f));
      break;
    }
    case 2:
      md.erase(key);
      break;
    case 3:
      if (!tensors.empty()) {
        gguf::TensorInfo& t = tensors[a % tensors.size()];
        const int d = b % 4;
        t.ne[d] = c[0] + 256 * c[1];
        t.n_dims = std::max(t.n_dims, d + 1);
      }
      break;
    case 4:
      if (!tensors.empty()) tensors[a % tensors.size()].type = kTypes[b % std::size(kTypes)];
      break;
    case 5:
      if (!tensors.empty()) tensors.erase(tensors.begin() + a % tensors.size());
      break;
    case 6:
      if (!tensors.empty()) std::swap(tensors[a % tensors.size()].name, tensors[b % tensors.size()].name);
      break;
    case 7: {
      const int n = b % 70;
      if (c[1] & 1) md.set(key, gguf::Value::string_array(std::vector<std::string>(n, std::string(c[0] % 8, 'x'))));
      else md.set(key, gguf::Value::i32_array(std::vector<int32_t>(n, (int8_t)c[0])));
      break;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > 8 * 64 + 1) return 0;
  const auto& all = bases();
  const gguf::GgufFile& base = *all[data[0] % all.size()].file;
  gguf::Metadata md = base.metadata();
  std::vector<gguf::TensorInfo> tensors = base.tensors();
  for (size_t p = 1; p + 8 <= size; p += 8) apply_edit(data + p, md, tensors);

  // Each tensor's bytes for its (possibly new) shape and type: the old bytes as far as they go, then zeros.
  std::vector<std::vector<uint8_t>> bytes(tensors.size());
  size_t total = 0;
  try {
    for (size_t i = 0; i < tensors.size(); ++i) {
      gguf::TensorInfo& t = tensors[i];
      const size_t n = gguf::tensor_bytes(t.type, t.ne);
      total += n;
      if (total > (size_t)64 << 20) return 0;  // a big model is not a malformed one
      bytes[i].assign(n, 0);
      if (n && t.data) std::memcpy(bytes[i].data(), t.data, std::min(n, t.n_bytes));
      t.data = bytes[i].data();
      t.n_bytes = n;
    }
  } catch (const Error&) {
    return 0;  // no file can hold such a tensor (a row length the type cannot have)
  }
  auto image = std::make_shared<std::vector<uint8_t>>(gguf::serialize_gguf(md, tensors, base.alignment()));
  try {
    std::shared_ptr<const gguf::GgufFile> file = gguf::GgufFile::parse("fuzz.gguf", image->data(), image->size(), image);
    static const char* kMixes[16] = {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                     nullptr, nullptr, nullptr, "Q4_K_M", "Q8_0", "Q2_K", "IQ4_XS", nullptr};
    if (const char* mix = kMixes[data[0] >> 4]) {
      static const fuzz::TempDir temp("fuzz-model-file");
      const std::string out = (temp.path() / "quantized.gguf").string();
      QuantizeOptions q;
      q.mix = find_mix(mix);
      q.n_threads = 1;
      q.allow_requantize = true;
      quantize_model(*file, out, q);
      file = gguf::GgufFile::open(out);
    }
    fuzz::run_a_few_tokens(Model::load(file));
  } catch (const Error&) {
    // refused with a message: fine
  } catch (const std::exception& e) {
    fuzz::defect("loading or running the model", e.what());
  }
  return 0;
}
