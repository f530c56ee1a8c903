// roofline quantize against llama-quantize: quantizing the F16 base of ../shared's qwen3-tiny512 set
// gives, for every type llama.cpp produced there, the same tensor order and types, the same metadata,
// and (no imatrix: the reference quantizers are bit-identical) the very same bytes.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include "formats/gguf.h"
#include "formats/quant_ref.h"
#include "model/quantize.h"
#include "model/synthetic.h"
#include "test_util.h"

using namespace roofline;

namespace {

const char* kTypes[] = {"Q8_0", "Q6_K", "Q5_K_M", "Q5_0", "Q4_K_M", "Q4_K_S", "IQ4_XS", "Q4_0", "Q3_K_M", "Q2_K"};

std::vector<char> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

uint64_t fnv1a64(const std::vector<char>& bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : bytes) h = (h ^ (uint8_t)c) * 0x100000001b3ull;
  return h;
}

}  // namespace

TEST(QuantizeLlamaCppTest, SameTypesOrderMetadataAndBytes) {
  ROOFLINE_SHARED_PATH_OR_SKIP(dir, "testdata/models/qwen3-tiny512-llamacpp");
  auto base = gguf::GgufFile::open(dir + "/qwen3-tiny512-F16.gguf");
  const std::string out_dir = test::temp_dir();
  for (const char* type : kTypes) {
    SCOPED_TRACE(type);
    const std::string ref_path = dir + "/qwen3-tiny512-" + type + ".gguf";
    const std::string out_path = out_dir + "/" + type + ".gguf";
    QuantizeOptions o;
    o.mix = find_mix(type);
    o.n_threads = 2;
    quantize_model(*base, out_path, o);
    auto ref = gguf::GgufFile::open(ref_path);
    auto ours = gguf::GgufFile::open(out_path);

    // Sizes within 1% (here: equal), same tensor order and types.
    const double ratio = (double)ours->file_size() / ref->file_size();
    EXPECT_NEAR(ratio, 1.0, 0.01) << ours->file_size() << " vs " << ref->file_size();
    ASSERT_EQ(ours->tensors().size(), ref->tensors().size());
    for (size_t i = 0; i < ref->tensors().size(); ++i) {
      EXPECT_EQ(ours->tensors()[i].name, ref->tensors()[i].name);
      EXPECT_EQ(dtype_name(ours->tensors()[i].type), dtype_name(ref->tensors()[i].type)) << ref->tensors()[i].name;
    }
    // Metadata: same keys in the same order (file_type and quantization_version at the end).
    ASSERT_EQ(ours->metadata().size(), ref->metadata().size());
    for (size_t i = 0; i < ref->metadata().size(); ++i)
      EXPECT_EQ(ours->metadata().entries()[i].first, ref->metadata().entries()[i].first);
    EXPECT_EQ(ours->metadata().get_int("general.file_type"), ref->metadata().get_int("general.file_type"));
    EXPECT_EQ(ours->metadata().get_int("general.quantization_version"), 2);

    // Every tensor's bytes, then the whole file.
    for (size_t i = 0; i < ref->tensors().size(); ++i) {
      const auto& a = ours->tensors()[i];
      const auto& b = ref->tensors()[i];
      ASSERT_EQ(a.n_bytes, b.n_bytes) << b.name;
      EXPECT_EQ(std::memcmp(a.data, b.data, a.n_bytes), 0) << "tensor bytes differ: " << b.name;
    }
    EXPECT_TRUE(file_bytes(out_path) == file_bytes(ref_path)) << "file bytes differ";
  }
}

// Qwen3.5 (qwen35): the synthetic tiny-qwen35 F16 file (written by `roofline synth`, deterministic)
// quantized to Q4_K_M is byte for byte the file llama-quantize made of it on the GPU machine
// (tests/fixtures/llamacpp/tiny-qwen35-Q4_K_M.gguf; Q5_K_M, Q6_K, Q8_0 and Q4_K_S were identical there
// too, docs/performance.md): attn_qkv and attn_v share llama.cpp's attn_v counter, ssm_conv1d, ssm_a
// and ssm_dt stay f32, the DeltaNet projections take the default type.
TEST(QuantizeLlamaCppTest, Qwen35Q4KMEqualsLlamaQuantize) {
  const std::string dir = test::temp_dir();
  const std::string f16 = dir + "/tiny-qwen35-F16.gguf", out = dir + "/tiny-qwen35-Q4_K_M.gguf";
  write_synthetic_model(parse_synthetic_spec("tiny-qwen35:F16"), f16, 2);
  QuantizeOptions o;
  o.mix = find_mix("Q4_K_M");
  o.n_threads = 2;
  quantize_model(*gguf::GgufFile::open(f16), out, o);
  const std::string ref = test::source_dir() + "/tests/fixtures/llamacpp/tiny-qwen35-Q4_K_M.gguf";
  auto a = gguf::GgufFile::open(out), b = gguf::GgufFile::open(ref);
  ASSERT_EQ(a->tensors().size(), b->tensors().size());
  for (size_t i = 0; i < b->tensors().size(); ++i) {
    EXPECT_EQ(a->tensors()[i].name, b->tensors()[i].name);
    EXPECT_EQ(dtype_name(a->tensors()[i].type), dtype_name(b->tensors()[i].type)) << b->tensors()[i].name;
  }
  EXPECT_TRUE(file_bytes(out) == file_bytes(ref)) << "file bytes differ";
}

// Dequantizing llama.cpp's tensors and requantizing them to the same type reproduces them (the
// reference quantizer is a fixed point on its own grid for the absmax types).
TEST(QuantizeLlamaCppTest, Q8_0IsAFixedPoint) {
  ROOFLINE_SHARED_PATH_OR_SKIP(dir, "testdata/models/qwen3-tiny512-llamacpp");
  auto q8 = gguf::GgufFile::open(dir + "/qwen3-tiny512-Q8_0.gguf");
  const auto& t = q8->tensor("blk.0.ffn_down.weight");
  std::vector<float> f((size_t)t.n_elements());
  dequantize_rows_ref(t.type, t.data, f.data(), t.n_rows(), t.row_length());
  std::vector<uint8_t> again(t.n_bytes);
  quantize_rows_ref(t.type, f.data(), again.data(), t.n_rows(), t.row_length());
  EXPECT_EQ(std::memcmp(again.data(), t.data, t.n_bytes), 0);
}

// Mixes without a llama.cpp file in ../shared: llama-quantize (CPU build of the llama.cpp snapshot in
// this workspace, the one scripts/gpu/build_llamacpp.sh builds; it reproduces ../shared's Q4_K_M file
// byte for byte) was run on the same F16 base with 2 threads and no imatrix, and its files' sizes and
// FNV-1a 64 hashes of their bytes are written down here. roofline's file must be the same bytes, with
// the tensor types llama.cpp chose (every matrix of the mix's type, output.weight Q6_K; Q3_K_L: attn_v,
// attn_output and ffn_down Q5_K).
TEST(QuantizeLlamaCppTest, MoreMixesEqualLlamaQuantizeByHash) {
  ROOFLINE_SHARED_PATH_OR_SKIP(dir, "testdata/models/qwen3-tiny512-llamacpp");
  auto base = gguf::GgufFile::open(dir + "/qwen3-tiny512-F16.gguf");
  const std::string out_dir = test::temp_dir();
  struct Case {
    const char* mix;
    DType matrices;
    uint64_t size, fnv;
  };
  const Case cases[] = {
      {"Q4_1", DType::Q4_1, 1191552, 0x8bac2fe7dc8908e3ull},   {"Q5_1", DType::Q5_1, 1404544, 0xb55b1efe5f65513full},
      {"IQ4_NL", DType::IQ4_NL, 1085056, 0x16737d2bea19abd4ull}, {"Q5_K_S", DType::Q5_K, 1298048, 0x6367892554d9087full},
      {"Q3_K_L", DType::Q3_K, 1010816, 0x40aac576cd6c9821ull},   {"Q3_K_S", DType::Q3_K, 858752, 0xf7bdbd9cebf33319ull},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.mix);
    QuantizeOptions o;
    o.mix = find_mix(c.mix);
    o.n_threads = 2;
    const std::string path = out_dir + "/" + c.mix + ".gguf";
    quantize_model(*base, path, o);
    auto f = gguf::GgufFile::open(path);
    EXPECT_EQ(f->metadata().get_int("general.file_type"), (int64_t)find_mix(c.mix)->file_type);
    for (const auto& t : f->tensors()) {
      DType want = c.matrices;
      if (t.n_dims == 1) want = DType::F32;
      else if (t.name == "output.weight") want = DType::Q6_K;
      else if (std::string(c.mix) == "Q3_K_L" && (t.name.find("attn_v") != std::string::npos || t.name.find("attn_output") != std::string::npos ||
                                                   t.name.find("ffn_down") != std::string::npos))
        want = DType::Q5_K;
      EXPECT_EQ(dtype_name(t.type), dtype_name(want)) << t.name;
    }
    const auto bytes = file_bytes(path);
    EXPECT_EQ(bytes.size(), c.size);
    EXPECT_EQ(fnv1a64(bytes), c.fnv) << "not the bytes llama-quantize wrote";
  }
}

// Every mix quantizes and loads back, smaller than F16 in the expected order; F16 from F16 copies.
TEST(QuantizeLlamaCppTest, EveryMixQuantizes) {
  ROOFLINE_SHARED_PATH_OR_SKIP(dir, "testdata/models/qwen3-tiny512-llamacpp");
  auto base = gguf::GgufFile::open(dir + "/qwen3-tiny512-F16.gguf");
  const std::string out_dir = test::temp_dir();
  std::map<std::string, uint64_t> size;
  for (const char* type : {"Q5_K_S", "Q3_K_L", "Q3_K_S", "F16", "BF16", "F32", "Q8_0", "Q6_K", "Q4_K_M", "Q2_K"}) {
    QuantizeOptions o;
    o.mix = find_mix(type);
    o.n_threads = 2;
    const std::string path = out_dir + "/mix-" + type + ".gguf";
    quantize_model(*base, path, o);
    auto f = gguf::GgufFile::open(path);
    size[type] = f->file_size();
    EXPECT_EQ(f->metadata().get_int("general.file_type"), (int64_t)find_mix(type)->file_type) << type;
  }
  {  // F16 from F16: every tensor copied unchanged
    auto f16 = gguf::GgufFile::open(out_dir + "/mix-F16.gguf");
    for (const auto& t : base->tensors()) {
      const auto& u = f16->tensor(t.name);
      ASSERT_EQ(u.n_bytes, t.n_bytes);
      EXPECT_EQ(std::memcmp(u.data, t.data, t.n_bytes), 0) << t.name;
    }
  }
  EXPECT_LT(size["F16"], size["F32"]);
  EXPECT_EQ(size["F16"], size["BF16"]);
  EXPECT_LT(size["Q8_0"], size["F16"]);
  EXPECT_LT(size["Q6_K"], size["Q8_0"]);
  EXPECT_LT(size["Q5_K_S"], size["Q6_K"]);
  EXPECT_LT(size["Q4_K_M"], size["Q5_K_S"]);
  EXPECT_LT(size["Q3_K_L"], size["Q4_K_M"]);
  EXPECT_LT(size["Q3_K_S"], size["Q3_K_L"]);
  EXPECT_LT(size["Q2_K"], size["Q3_K_S"]);
}
