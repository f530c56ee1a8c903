// Gemma 3 against Hugging Face transformers, when the fixtures made by
// scripts/fixtures/make_gemma3_fixtures.py are in tests/fixtures/gemma3/ (skipped otherwise): each tiny
// random checkpoint (sliding window 8, shorter than the scored sequences) is converted with `roofline
// convert` (f32, its own dtype, q8_0), run through the CPU engine in prompt chunks and one token at a time,
// and compared with transformers' float64 logits (NMSE, KL divergence and top-token agreement as the
// issue's bar asks), the double reference over the converted file likewise (the maths), greedy choices
// where transformers' margin is clear, and the tokenizer's ids for the prompt text.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/gpu.h"
#include "convert/convert.h"
#include "engine/engine.h"
#include "engine/reference_forward.h"
#include "formats/gguf.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

using namespace roofline;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string gemma_fixtures_dir() { return test::source_dir() + "/tests/fixtures/gemma3"; }

std::vector<std::string> fixture_names() {
  std::vector<std::string> names;
  if (!fs::is_directory(gemma_fixtures_dir())) return names;
  for (const auto& e : fs::directory_iterator(gemma_fixtures_dir()))
    if (fs::exists(e.path() / "expected.json")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

struct Fixture {
  std::string dir;
  json expected;
  std::vector<float> logits;  // [rows x hf_vocab]
  int hf_vocab = 0;
};

Fixture load(const std::string& name) {
  Fixture f;
  f.dir = gemma_fixtures_dir() + "/" + name;
  f.expected = json::parse(std::ifstream(f.dir + "/expected.json"));
  const auto shape = f.expected["logits_shape"].get<std::vector<int64_t>>();
  f.hf_vocab = (int)shape[1];
  f.logits.resize((size_t)(shape[0] * shape[1]));
  std::ifstream in(f.dir + "/" + f.expected["logits_file"].get<std::string>(), std::ios::binary);
  in.read(reinterpret_cast<char*>(f.logits.data()), (std::streamsize)(f.logits.size() * 4));
  EXPECT_TRUE(in.good()) << f.dir;
  return f;
}

std::string converted(const Fixture& fx, const std::string& outtype) {
  convert::ConvertOptions o;
  o.source = fx.dir;
  o.output = test::temp_dir() + "/" + fs::path(fx.dir).filename().string() + "-" + outtype + ".gguf";
  o.outtype = outtype;
  o.progress = false;
  o.n_threads = 2;
  convert::convert_model(o);
  return o.output;
}

// Worst-row NMSE, mean KL(HF || ours) over the rows (natural log), and the share of rows whose top token
// agrees; `n` columns compared (the converted vocabulary; transformers' extra padding rows dropped).
struct Score {
  double worst_nmse = 0, mean_kld = 0, same_top = 0;
};
Score score(const std::vector<float>& got, int got_stride, const std::vector<float>& want, int want_stride, int n, size_t rows) {
  Score s;
  size_t agree = 0;
  for (size_t r = 0; r < rows; ++r) {
    const float* a = got.data() + r * got_stride;
    const float* b = want.data() + r * want_stride;
    double num = 0, den = 0, ma = -1e300, mb = -1e300;
    int ta = 0, tb = 0;
    for (int v = 0; v < n; ++v) {
      num += (a[v] - (double)b[v]) * (a[v] - (double)b[v]);
      den += (double)b[v] * b[v];
      if (a[v] > ma) ma = a[v], ta = v;
      if (b[v] > mb) mb = b[v], tb = v;
    }
    s.worst_nmse = std::max(s.worst_nmse, num / den);
    double za = 0, zb = 0;
    for (int v = 0; v < n; ++v) za += std::exp(a[v] - ma), zb += std::exp(b[v] - mb);
    double kld = 0;
    for (int v = 0; v < n; ++v) {
      const double lpb = b[v] - mb - std::log(zb), lpa = a[v] - ma - std::log(za);
      kld += std::exp(lpb) * (lpb - lpa);
    }
    s.mean_kld += kld / (double)rows;
    agree += ta == tb;
  }
  s.same_top = (double)agree / (double)rows;
  return s;
}

void run(const std::string& name) {
  const Fixture fx = load(name);
  const std::string native = fx.expected["source_dtype"] == "bfloat16" ? "bf16" : (fx.expected["source_dtype"] == "float16" ? "f16" : "f32");
  std::vector<std::string> types = {"f32", "q8_0"};
  if (native != "f32") types.insert(types.begin() + 1, native);
  for (const std::string& outtype : types) {
    SCOPED_TRACE(name + " " + outtype);
    auto model = Model::load(gguf::GgufFile::open(converted(fx, outtype)));
    const int n_vocab = model->hparams().n_vocab;
    ASSERT_LE(n_vocab, fx.hf_vocab);
    EXPECT_TRUE(model->hparams().has_sliding_layers());
    // Prompt chunks of 5 (the window's edge inside a chunk) and, separately, one token at a time.
    std::vector<float> chunked, stepped, ref;
    size_t rows = 0;
    for (int n_batch : {5, 1}) {
      EngineOptions o;
      o.type_k = o.type_v = DType::F32;
      o.n_threads = 2;
      o.n_ctx = 256;
      o.n_batch = n_batch;
      o.kv_block_size = 4;
      auto engine = Engine::create(model, o);
      for (const auto& s : fx.expected["sequences"]) {
        const auto tokens = s.get<std::vector<int32_t>>();
        const int seq = engine->memory().create_sequence();
        const auto l = engine->eval(seq, tokens, true);
        engine->memory().free_sequence(seq);
        (n_batch == 5 ? chunked : stepped).insert((n_batch == 5 ? chunked : stepped).end(), l.begin(), l.end());
        if (n_batch == 5) rows += tokens.size();
      }
    }
    for (const auto& s : fx.expected["sequences"]) {
      test::ReferenceForward r(*model);
      for (int32_t t : s.get<std::vector<int32_t>>())
        for (double x : r.step(t)) ref.push_back((float)x);
    }
    ASSERT_EQ(chunked.size(), rows * n_vocab);
    const Score e = score(chunked, n_vocab, fx.logits, fx.hf_vocab, n_vocab, rows);
    const Score w = score(ref, n_vocab, fx.logits, fx.hf_vocab, n_vocab, rows);
    const Score k = score(chunked, n_vocab, ref, n_vocab, n_vocab, rows);
    const Score d = score(stepped, n_vocab, chunked, n_vocab, n_vocab, rows);
    std::printf("[gemma3 fixture] %-16s %-5s engine-vs-HF NMSE %.2e KLD %.2e top %.3f | reference-vs-HF NMSE %.2e | "
                "engine-vs-ref NMSE %.2e | decode-vs-chunks NMSE %.2e\n",
                name.c_str(), outtype.c_str(), e.worst_nmse, e.mean_kld, e.same_top, w.worst_nmse, k.worst_nmse, d.worst_nmse);
    EXPECT_LE(d.worst_nmse, 1e-10) << "decoding one token at a time differs from prompt chunks";
    // The bar (mean KLD <= 1e-4, same top >= 98%) on the lossless conversions, with far tighter
    // NMSE bounds; q8_0 is printed (these random fixtures amplify weight rounding ~100x).
    // Bounds: ~3-100x the measurements of this build (tests/fixtures/README.md): lossless 6.2e-13 /
    // 3.3e-14 / 5.7e-13 (engine-vs-HF / reference-vs-HF / engine-vs-reference), q8_0 3.9e-3 / 2.5e-3 / 1.5e-3.
    if (outtype == "f32" || outtype == native) {
      EXPECT_LE(e.mean_kld, 1e-4);
      EXPECT_GE(e.same_top, 0.98);
      EXPECT_LE(w.worst_nmse, 1e-12) << "the reference's Gemma 3 maths differ from transformers'";
      EXPECT_LE(e.worst_nmse, 5e-11);
      EXPECT_LE(k.worst_nmse, 5e-11);
    } else {
      EXPECT_LE(e.worst_nmse, 6e-3);
      EXPECT_LE(w.worst_nmse, 4e-3);
      EXPECT_LE(k.worst_nmse, 2.5e-3);
    }
    // The GPU, every layer on it (f16 tensor-core prefill attention), against transformers likewise.
    if (!gpu_devices().empty() && outtype != "q8_0") {
      EngineOptions o;
      o.type_k = o.type_v = DType::F32;
      o.n_threads = 2;
      o.n_ctx = 256;
      o.n_gpu_layers = EngineOptions::kGpuLayersAll;
      auto engine = Engine::create(model, o);
      std::vector<float> gpu;
      for (const auto& s : fx.expected["sequences"]) {
        const auto tokens = s.get<std::vector<int32_t>>();
        const int seq = engine->memory().create_sequence();
        const auto l = engine->eval(seq, tokens, true);
        engine->memory().free_sequence(seq);
        gpu.insert(gpu.end(), l.begin(), l.end());
      }
      const Score g = score(gpu, n_vocab, fx.logits, fx.hf_vocab, n_vocab, rows);
      std::printf("[gemma3 fixture] %-16s %-5s GPU engine-vs-HF NMSE %.2e KLD %.2e top %.3f\n", name.c_str(), outtype.c_str(),
                  g.worst_nmse, g.mean_kld, g.same_top);
      EXPECT_LE(g.mean_kld, 1e-4);
      EXPECT_GE(g.same_top, 0.98);
    }
  }
  // Greedy, teacher-forced, where transformers' top-2 margin is clear; the tokenizer's ids.
  auto model = Model::load(gguf::GgufFile::open(converted(fx, "f32")));
  EngineOptions o;
  o.type_k = o.type_v = DType::F32;
  o.n_threads = 2;
  o.n_ctx = 256;
  auto engine = Engine::create(model, o);
  const auto& g = fx.expected["greedy"];
  const int seq = engine->memory().create_sequence();
  std::vector<float> logits = engine->eval(seq, g["prompt"].get<std::vector<int32_t>>(), false);
  const auto tokens = g["tokens"].get<std::vector<int32_t>>();
  const auto margins = g["margins"].get<std::vector<double>>();
  int checked = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t best = (int32_t)(std::max_element(logits.begin(), logits.end()) - logits.begin());
    if (margins[i] > 1e-3) {
      ++checked;
      EXPECT_EQ(best, tokens[i]) << "greedy step " << i;
    }
    const int32_t next[1] = {tokens[i]};
    logits = engine->eval(seq, next, false);
  }
  EXPECT_GE(checked, 12);
  auto tok = Tokenizer::from_metadata(model->metadata());
  EXPECT_EQ(tok->encode(fx.expected["prompt_text"].get<std::string>(), true),
            fx.expected["prompt_text_tokens"].get<std::vector<int32_t>>());
}

}  // namespace

TEST(Gemma3FixturesTest, MatchTransformers) {
  const auto names = fixture_names();
  if (names.empty()) GTEST_SKIP() << "no fixtures in tests/fixtures/gemma3 (scripts/fixtures/make_gemma3_fixtures.py makes them)";
  for (const auto& name : names) run(name);
}
