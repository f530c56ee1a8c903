// `roofline quantize` on mixture-of-experts files (tiny-qwen3moe, tiny-qwen35moe written as F16): the
// stacked 3-D experts keep their shape and are quantized row by row over all experts (what
// llama-quantize does without an importance matrix: each expert's rows in turn), the routers and the
// [n_embd, 1] shared-expert gate stay F32, every tensor gets the type llama.cpp's Q4_K_M mix gives it
// (the synthetic Q4_K_M layout), and the quantized model stays close to the F16 one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "engine/engine.h"
#include "formats/gguf.h"
#include "formats/quant_ref.h"
#include "model/quant_mix.h"
#include "model/quantize.h"
#include "model/synthetic.h"
#include "test_util.h"

using namespace roofline;

TEST(QuantizeMoeTest, StackedExpertsQuantizeRowByRowWithLlamaCppsMix) {
  for (const char* shape : {"tiny-qwen3moe", "tiny-qwen35moe"}) {
    SCOPED_TRACE(shape);
    const std::string f16 = test::temp_dir() + "/" + shape + "-F16.gguf", q = test::temp_dir() + "/" + shape + "-Q4_K_M.gguf";
    write_synthetic_model(parse_synthetic_spec(std::string("synthetic:") + shape + ":F16"), f16, 2);
    QuantizeOptions o;
    o.mix = find_mix("Q4_K_M");
    o.n_threads = 2;
    auto src = gguf::GgufFile::open(f16);
    quantize_model(*src, q, o);
    auto out = gguf::GgufFile::open(q);
    const SyntheticLayout mix = synthetic_layout(parse_synthetic_spec(std::string("synthetic:") + shape + ":Q4_K_M"));
    int n_exps = 0;
    for (const auto& t : out->tensors()) {
      const gguf::TensorInfo* s = src->find_tensor(t.name);
      ASSERT_NE(s, nullptr) << t.name;
      EXPECT_EQ(t.n_dims, s->n_dims) << t.name;
      EXPECT_EQ(t.ne, s->ne) << t.name;
      const gguf::TensorInfo* want = nullptr;
      for (const auto& m : mix.tensors)
        if (m.name == t.name) want = &m;
      ASSERT_NE(want, nullptr) << t.name;
      EXPECT_EQ(t.type, want->type) << t.name << ": " << dtype_name(t.type) << " vs the mix's " << dtype_name(want->type);
      if (t.name.find("ffn_gate_inp") != std::string::npos) {
        EXPECT_EQ(t.type, DType::F32) << t.name;
      }
      if (t.name.find("_exps.weight") == std::string::npos) continue;
      ++n_exps;
      ASSERT_EQ(t.n_dims, 3);
      // Bytes: the source rows of every expert, quantized in order.
      std::vector<float> rows((size_t)s->n_elements());
      dequantize_rows_ref(s->type, s->data, rows.data(), s->n_rows(), s->row_length());
      std::vector<uint8_t> bytes(t.n_bytes);
      quantize_rows_ref(t.type, rows.data(), bytes.data(), t.n_rows(), t.row_length());
      EXPECT_EQ(0, std::memcmp(bytes.data(), t.data, t.n_bytes)) << t.name;
    }
    EXPECT_EQ(n_exps, 3 * (int)src->metadata().get_int(src->metadata().get_string("general.architecture") + ".block_count"));

    // Close to the F16 model on a few tokens: measured 0.027 (qwen3moe) and 0.068 (qwen35moe), as the
    // dense tiny-qwen3 (0.028) and tiny-qwen35 (0.057) do with these random weights.
    auto logits = [](const std::string& path) {
      EngineOptions eo;
      eo.n_threads = 2;
      eo.n_ctx = 64;
      auto engine = Engine::create(Model::load(gguf::GgufFile::open(path)), eo);
      const std::vector<int32_t> toks = {3, 99, 250, 17, 400, 8, 77};
      return engine->eval(engine->memory().create_sequence(), toks, true);
    };
    const auto a = logits(f16), b = logits(q);
    const double e = test::nmse(b.data(), a.data(), a.size());
    std::printf("%s Q4_K_M vs F16: logits NMSE %.3g\n", shape, e);
    EXPECT_LT(e, 0.12);
  }
}
