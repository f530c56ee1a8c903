// The CUDA backend against the references (skipped where no GPU is present, e.g. CI): matrix
// products of every weight type at decode and prefill sizes, and whole models against the CPU
// engine for full and partial offload and every KV type; decode batches are bit-identical alone and
// together; results are reproducible. Run on the GPU machine: roofline_tests --gtest_filter='Gpu*'.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "backend/gpu.h"
#include "core/rng.h"
#include "engine/engine.h"
#include "formats/quant_ref.h"
#include "model/model_file.h"
#include "test_util.h"

using namespace roofline;

namespace {

bool have_gpu() { return !gpu_devices().empty(); }
#define SKIP_WITHOUT_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU in this build or machine"

std::shared_ptr<const Model> tiny(const std::string& spec) { return Model::load(open_model_file("synthetic:" + spec)); }

std::vector<int32_t> some_tokens(int n, int n_vocab, int salt = 0) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((int32_t)((i * 131 + 7 + salt * 29) % n_vocab));
  return t;
}

std::vector<float> run_logits(std::shared_ptr<const Model> model, EngineOptions o, const std::vector<int32_t>& tokens) {
  auto engine = Engine::create(model, o);
  const int seq = engine->kv_cache().create_sequence();
  // A prefill chunk, then single decode steps.
  const size_t split = tokens.size() / 2;
  auto out = engine->eval(seq, std::span<const int32_t>(tokens.data(), split), true);
  for (size_t i = split; i < tokens.size(); ++i) {
    auto l = engine->eval(seq, std::span<const int32_t>(&tokens[i], 1), false);
    out.insert(out.end(), l.begin(), l.end());
  }
  return out;
}

}  // namespace

TEST(GpuMatmulTest, EveryTypeAtDecodeAndPrefillSizes) {
  SKIP_WITHOUT_GPU();
  const DType types[] = {DType::F32, DType::F16, DType::BF16, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                         DType::Q8_0, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL,
                         DType::IQ4_XS};
  Rng rng(3);
  for (DType type : types) {
    const int64_t cols = dtype_block_size(type) == 256 ? 768 : (type == DType::F32 || type == DType::F16 || type == DType::BF16 ? 100 : 96);
    const int64_t rows = 67;
    std::vector<float> wf((size_t)(rows * cols));
    for (float& v : wf) v = (float)rng.normal() * 0.05f;
    std::vector<uint8_t> wq(dtype_row_bytes(type, cols) * rows);
    quantize_rows_ref(type, wf.data(), wq.data(), rows, cols);
    std::vector<float> wd(wf.size());
    dequantize_rows_ref(type, wq.data(), wd.data(), rows, cols);
    gguf::TensorInfo info;
    info.name = "w";
    info.type = type;
    info.n_dims = 2;
    info.ne = {cols, rows, 1, 1};
    info.n_bytes = wq.size();
    info.data = wq.data();
    const Weight w{&info};
    for (int n : {1, 3, 8, 9, 33, 48, 49, 65}) {
      std::vector<float> x((size_t)(n * cols));
      for (float& v : x) v = (float)rng.normal();
      const auto y = gpu_matmul_for_test(w, x, n);
      std::vector<float> ref((size_t)(n * rows));
      for (int t = 0; t < n; ++t)
        for (int64_t r = 0; r < rows; ++r) {
          double s = 0;
          for (int64_t c = 0; c < cols; ++c) s += (double)wd[r * cols + c] * x[t * cols + c];
          ref[t * rows + r] = (float)s;
        }
      const double e = test::nmse(y.data(), ref.data(), ref.size());
      // int8 activations (decode, quantized types) ~1e-4; f16 inputs (GEMM) ~1e-6; float matvec ~1e-12.
      const bool q8 = n <= 8 && (type == DType::Q4_K || type == DType::Q5_K || type == DType::Q6_K || type == DType::Q8_0);
      const double bound = q8 ? 2e-4 : n > 8 ? 2e-6 : 1e-9;
      EXPECT_LT(e, bound) << dtype_name(type) << " n=" << n;
    }
  }
}

TEST(GpuEngineTest, FullOffloadMatchesCpuForEveryMix) {
  SKIP_WITHOUT_GPU();
  for (const char* spec : {"tiny-qwen3:F32", "tiny-qwen3:F16", "tiny-qwen3:Q8_0", "tiny-qwen3:Q4_K_M", "tiny-llama:Q6_K",
                           "tiny-qwen2:Q5_K_M", "tiny-llama:Q2_K", "tiny-qwen3:Q3_K_M", "tiny-qwen3:IQ4_XS",
                           "tiny-qwen2:Q4_0", "tiny-llama:Q5_0", "tiny-qwen3:BF16"}) {
    auto model = tiny(spec);
    const auto tokens = some_tokens(24, model->hparams().n_vocab);
    EngineOptions cpu, gpu;
    gpu.n_gpu_layers = EngineOptions::kGpuLayersAll;
    const auto a = run_logits(model, cpu, tokens), b = run_logits(model, gpu, tokens);
    ASSERT_EQ(a.size(), b.size());
    const double e = test::nmse(b.data(), a.data(), a.size());
    std::printf("%-20s GPU vs CPU logits NMSE %.3g\n", spec, e);
    EXPECT_LT(e, 2e-3) << spec;
  }
}

TEST(GpuEngineTest, PartialOffloadAndKvTypes) {
  SKIP_WITHOUT_GPU();
  auto model = tiny("tiny-qwen3:Q4_K_M");  // 2 layers + output = 3 units
  const auto tokens = some_tokens(20, model->hparams().n_vocab);
  EngineOptions cpu;
  const auto ref = run_logits(model, cpu, tokens);
  for (int ngl : {1, 2, 3}) {
    EngineOptions o;
    o.n_gpu_layers = ngl;
    const auto l = run_logits(model, o, tokens);
    EXPECT_LT(test::nmse(l.data(), ref.data(), ref.size()), 2e-3) << "-ngl " << ngl;
  }
  for (DType kv : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0}) {
    EngineOptions c, g;
    c.type_k = c.type_v = g.type_k = g.type_v = kv;
    g.n_gpu_layers = EngineOptions::kGpuLayersAll;
    const auto a = run_logits(model, c, tokens), b = run_logits(model, g, tokens);
    const double e = test::nmse(b.data(), a.data(), a.size());
    std::printf("KV %-5s GPU vs CPU logits NMSE %.3g\n", dtype_name(kv).c_str(), e);
    EXPECT_LT(e, kv == DType::Q4_0 ? 2e-2 : 3e-3) << dtype_name(kv);
  }
}

TEST(GpuEngineTest, DecodeBatchesAreInvariantAndReproducible) {
  SKIP_WITHOUT_GPU();
  auto model = tiny("tiny-llama:Q4_K_M");
  const int n_vocab = model->hparams().n_vocab;
  EngineOptions o;
  o.n_gpu_layers = EngineOptions::kGpuLayersAll;
  const auto prompt_a = some_tokens(5, n_vocab, 1), prompt_b = some_tokens(6, n_vocab, 2);
  auto decode_alone = [&]() {
    auto e = Engine::create(model, o);
    const int s = e->kv_cache().create_sequence();
    std::vector<float> out;
    for (int32_t t : prompt_a) {  // one row per step: matvec path throughout
      auto l = e->eval(s, std::span<const int32_t>(&t, 1), false);
      out.insert(out.end(), l.begin(), l.end());
    }
    return out;
  };
  const auto alone = decode_alone();
  EXPECT_EQ(alone, decode_alone()) << "reproducible";
  auto e = Engine::create(model, o);
  const int sb = e->kv_cache().create_sequence(), sa = e->kv_cache().create_sequence();
  for (size_t i = 0; i < prompt_a.size(); ++i) {
    std::vector<Engine::BatchRow> batch = {{sb, prompt_b[i], false}, {sa, prompt_a[i], true}};
    auto l = e->decode(batch);
    ASSERT_EQ(l.size(), (size_t)n_vocab);
    EXPECT_EQ(0, std::memcmp(l.data(), alone.data() + i * n_vocab, n_vocab * sizeof(float))) << "step " << i;
  }
}

TEST(GpuEngineTest, CudaGraphsGiveTheSameLogits) {
  SKIP_WITHOUT_GPU();
  auto model = tiny("tiny-qwen3:Q4_K_M");
  EngineOptions o;
  o.n_gpu_layers = EngineOptions::kGpuLayersAll;
  const auto tokens = some_tokens(12, model->hparams().n_vocab);
  const auto with_graphs = run_logits(model, o, tokens);
  setenv("ROOFLINE_NO_CUDA_GRAPHS", "1", 1);
  const auto without = run_logits(model, o, tokens);
  unsetenv("ROOFLINE_NO_CUDA_GRAPHS");
  EXPECT_EQ(with_graphs, without);
}

TEST(GpuEngineTest, ForkCopiesBlocksOnTheGpu) {
  SKIP_WITHOUT_GPU();
  auto model = tiny("tiny-qwen3:Q8_0");
  const int n_vocab = model->hparams().n_vocab;
  EngineOptions o;
  o.n_gpu_layers = EngineOptions::kGpuLayersAll;
  o.kv_block_size = 16;
  const auto prefix = some_tokens(21, n_vocab), tail = some_tokens(3, n_vocab, 4);
  auto e = Engine::create(model, o);
  const int s = e->kv_cache().create_sequence();
  e->eval(s, prefix, false);
  const int f = e->fork_sequence(s);
  const auto lf = e->eval(f, tail, true);
  auto fresh = Engine::create(model, o);
  std::vector<int32_t> full = prefix;
  full.insert(full.end(), tail.begin(), tail.end());
  const int s2 = fresh->kv_cache().create_sequence();
  fresh->eval(s2, prefix, false);
  const auto lr = fresh->eval(s2, tail, true);
  EXPECT_EQ(lf, lr);
}
