// Importance matrices: collection through the engine's matmul observer (which weights, how many rows,
// the means), both file formats round-tripping, merging, corrupt files refused with one line, and a
// quantization with an imatrix from a text lowering the error that text sees.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/imatrix.h"
#include "engine/perplexity.h"
#include "formats/gguf.h"
#include "formats/quant_ref.h"
#include "model/model_file.h"
#include "model/quantize.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

using namespace roofline;

namespace {

Imatrix random_imatrix(int chunk_size) {
  Imatrix im(chunk_size);
  std::mt19937 rng(7);
  std::normal_distribution<float> n(0.f, 1.f);
  for (const char* name : {"blk.0.attn_q.weight", "blk.0.ffn_down.weight", "blk.1.attn_k.weight"}) {
    const int cols = name[6] == 'f' ? 96 : 64;
    std::vector<float> x((size_t)40 * cols);
    for (float& v : x) v = n(rng);
    im.add(name, x.data(), 40, cols);
    im.add(name, x.data(), 24, cols);
  }
  im.add_dataset("calib.txt");
  return im;
}

std::string gpl_text() {
  std::ifstream in("/usr/share/common-licenses/GPL-3", std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(in)), {});
  return s.substr(0, std::min<size_t>(s.size(), 6000));
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

}  // namespace

TEST(ImatrixTest, GgufRoundTrip) {
  const Imatrix im = random_imatrix(64);
  const std::string path = test::temp_dir() + "/im.gguf";
  im.save(path, ImatrixFormat::Gguf);
  // The layout llama.cpp writes: general.type, imatrix.* keys, <name>.in_sum2 and <name>.counts sorted by name.
  auto f = gguf::GgufFile::open(path);
  EXPECT_EQ(f->metadata().get_string("general.type"), "imatrix");
  EXPECT_EQ(f->metadata().get_int("imatrix.chunk_size"), 64);
  EXPECT_EQ(f->metadata().get_int("imatrix.chunk_count"), 1);  // 64 rows per entry
  ASSERT_EQ(f->tensors().size(), 6u);
  EXPECT_EQ(f->tensors()[0].name, "blk.0.attn_q.weight.in_sum2");
  EXPECT_EQ(f->tensors()[1].name, "blk.0.attn_q.weight.counts");
  EXPECT_EQ(f->tensors()[2].name, "blk.0.ffn_down.weight.in_sum2");
  EXPECT_EQ(f->tensors()[0].n_dims, 1);
  const Imatrix back = Imatrix::load(path);
  ASSERT_EQ(back.entries().size(), im.entries().size());
  for (const auto& [name, e] : im.entries()) {
    const ImatrixEntry& b = back.entries().at(name);
    EXPECT_EQ(b.counts, e.counts) << name;
    ASSERT_EQ(b.sums.size(), e.sums.size());
    for (size_t j = 0; j < e.sums.size(); ++j) EXPECT_NEAR(b.sums[j], e.sums[j], 1e-6 * e.sums[j]) << name;
  }
  EXPECT_EQ(back.datasets(), std::vector<std::string>{"calib.txt"});
  EXPECT_EQ(back.chunk_count(), 1);
}

TEST(ImatrixTest, LegacyDatRoundTrip) {
  const Imatrix im = random_imatrix(32);
  const std::string path = test::temp_dir() + "/im.dat";
  im.save(path, ImatrixFormat::Dat);
  const Imatrix back = Imatrix::load(path, 32);
  const ImportanceData a = im.importance("x"), b = back.importance("x");
  ASSERT_EQ(a.values.size(), b.values.size());
  for (const auto& [name, v] : a.values)
    for (size_t j = 0; j < v.size(); ++j) EXPECT_NEAR(b.values.at(name)[j], v[j], 1e-5 * v[j]) << name;
  // 64 rows in chunks of 32: ncall 2; stored as mean * ncall, reloaded as 2 * 32 rows.
  EXPECT_EQ(back.entries().at("blk.0.attn_q.weight").counts[0], 64);
  EXPECT_EQ(back.datasets().back(), "calib.txt");
  // And GGUF -> dat -> GGUF keeps the means.
  const std::string gg = test::temp_dir() + "/again.gguf";
  back.save(gg, ImatrixFormat::Gguf);
  const ImportanceData c = Imatrix::load(gg).importance("x");
  for (const auto& [name, v] : a.values)
    for (size_t j = 0; j < v.size(); ++j) EXPECT_NEAR(c.values.at(name)[j], v[j], 1e-5 * v[j]) << name;
}

TEST(ImatrixTest, MergeAddsSumsAndCounts) {
  Imatrix a = random_imatrix(64);
  const Imatrix b = random_imatrix(64);
  a.merge(b);
  const auto& e = a.entries().at("blk.1.attn_k.weight");
  EXPECT_EQ(e.counts[0], 128);
  EXPECT_NEAR(e.sums[3], 2 * b.entries().at("blk.1.attn_k.weight").sums[3], 1e-9);
  EXPECT_EQ(a.chunk_count(), 2);
}

TEST(ImatrixTest, CorruptFilesAreRefused) {
  const std::string dir = test::temp_dir();
  auto expect_error = [](const std::string& path, const char* needle) {
    try {
      Imatrix::load(path);
      ADD_FAILURE() << path << " was accepted";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
      EXPECT_NE(m.find(needle), std::string::npos) << m;
    }
  };
  expect_error(dir + "/none.dat", "no such");
  write_bytes(dir + "/text.dat", "hello, this is text and not an imatrix");
  expect_error(dir + "/text.dat", "not an imatrix");
  const Imatrix im = random_imatrix(64);
  im.save(dir + "/good.dat", ImatrixFormat::Dat);
  std::ifstream in(dir + "/good.dat", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  write_bytes(dir + "/cut.dat", bytes.substr(0, bytes.size() / 2));
  expect_error(dir + "/cut.dat", "corrupt");
  std::string negative = bytes;
  const float minus = -1.f;
  std::memcpy(negative.data() + 4 + 4 + 19 + 8, &minus, 4);  // the first value of the first entry
  write_bytes(dir + "/neg.dat", negative);
  expect_error(dir + "/neg.dat", "corrupt");
  // A GGUF model is not an imatrix; a GGUF with half an entry is corrupt.
  auto model = open_model_file("synthetic:tiny-qwen3:F32");
  gguf::write_gguf(dir + "/model.gguf", model->metadata(), model->tensors());
  expect_error(dir + "/model.gguf", "not an importance matrix");
  gguf::Metadata md;
  md.set("general.type", gguf::Value::string("imatrix"));
  std::vector<float> sums(64, 1.f);
  gguf::TensorInfo t;
  t.name = "blk.0.attn_q.weight.in_sum2";
  t.ne = {64, 1, 1, 1};
  t.n_bytes = 256;
  t.data = reinterpret_cast<const uint8_t*>(sums.data());
  gguf::write_gguf(dir + "/half.gguf", md, {t});
  expect_error(dir + "/half.gguf", "counts");
  // fuzz_imatrix: a count of 1e30 loaded (as an out-of-range llround), and what save then wrote did not
  // load. Counts past 2^53 rows are corrupt; merges past it are refused.
  const float huge = 1e30f;
  gguf::TensorInfo c = t;
  c.name = "blk.0.attn_q.weight.counts";
  c.ne = {1, 1, 1, 1};
  c.n_bytes = 4;
  c.data = reinterpret_cast<const uint8_t*>(&huge);
  gguf::write_gguf(dir + "/huge.gguf", md, {t, c});
  expect_error(dir + "/huge.gguf", "has count");
  const float most = 9007199254740992.0f;  // 2^53: accepted, and two of them do not merge
  c.data = reinterpret_cast<const uint8_t*>(&most);
  gguf::write_gguf(dir + "/most.gguf", md, {t, c});
  Imatrix a = Imatrix::load(dir + "/most.gguf");
  EXPECT_EQ(a.entries().at("blk.0.attn_q.weight").counts[0], int64_t{1} << 53);
  const Imatrix b = Imatrix::load(dir + "/most.gguf");
  EXPECT_THROW(a.merge(b), Error);
  // fuzz_imatrix: imatrix.chunk_size 0 divided by zero when saved as a legacy file; a chunk size of 1
  // with 2^53 rows gave a negative int32 call count there. The first is corrupt, the second GGUF only.
  md.set("imatrix.chunk_size", gguf::Value::u32(0));
  gguf::write_gguf(dir + "/chunk0.gguf", md, {t, c});
  expect_error(dir + "/chunk0.gguf", "chunk_size");
  md.set("imatrix.chunk_size", gguf::Value::u32(1));
  gguf::write_gguf(dir + "/chunk1.gguf", md, {t, c});
  const Imatrix one = Imatrix::load(dir + "/chunk1.gguf");
  try {
    one.save(dir + "/chunk1.dat", ImatrixFormat::Dat);
    ADD_FAILURE() << "2^53 windows were written as a legacy call count";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("save it as GGUF"), std::string::npos) << e.what();
  }
}

// fuzz_imatrix: an imatrix whose entries hold no counts saved as a legacy file of no entries, which no
// reader takes (llama.cpp's neither): save refuses it with one line.
TEST(ImatrixTest, AnImatrixWithoutCountsIsNotSaved) {
  const std::string dir = test::temp_dir();
  Imatrix im = random_imatrix(64);
  for (auto& [name, e] : im.entries()) std::fill(e.counts.begin(), e.counts.end(), 0);
  try {
    im.save(dir + "/none.dat", ImatrixFormat::Dat);
    ADD_FAILURE() << "a legacy file of no entries was written";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds counts"), std::string::npos) << e.what();
  }
  im.save(dir + "/zero.gguf", ImatrixFormat::Gguf);  // GGUF keeps them, counts 0 (means of one)
  EXPECT_EQ(Imatrix::load(dir + "/zero.gguf").entries().size(), im.entries().size());
}

// fuzz_imatrix: a legacy value of 3e38 loaded (its sums, value x chunk size, past float32), and the GGUF
// that save wrote held inf, which load refuses. Such a value is corrupt at load; sums that merges push
// past float32 are refused by save instead of written.
TEST(ImatrixTest, SumsPastFloat32AreRefusedNotWritten) {
  const std::string dir = test::temp_dir();
  auto dat = [](float v) {
    std::string b;
    auto put = [&](const void* p, size_t n) { b.append((const char*)p, n); };
    const int32_t one = 1, len = 6, ncall = 1, nval = 2;
    put(&one, 4);
    put(&len, 4);
    b += "w.0.ab";
    put(&ncall, 4);
    put(&nval, 4);
    put(&v, 4);
    put(&v, 4);
    return b;
  };
  write_bytes(dir + "/big.dat", dat(3e38f));
  try {
    Imatrix::load(dir + "/big.dat");
    ADD_FAILURE() << "a value of 3e38 a row over 512 rows loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("too large"), std::string::npos) << e.what();
  }
  write_bytes(dir + "/large.dat", dat(3e35f));  // sums 1.5e38: fit, and two of them do not
  Imatrix a = Imatrix::load(dir + "/large.dat");
  a.merge(Imatrix::load(dir + "/large.dat"));
  a.merge(Imatrix::load(dir + "/large.dat"));
  try {
    a.save(dir + "/merged.gguf", ImatrixFormat::Gguf);
    ADD_FAILURE() << "sums past float32 were written";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("float32"), std::string::npos) << e.what();
  }
}

// The observer sees every layer matrix of the tiny model with the rows of each window.
TEST(ImatrixTest, CollectsFromTheEngine) {
  ROOFLINE_SHARED_PATH_OR_SKIP(dir, "testdata/models/qwen3-tiny512-llamacpp");
  auto model = Model::load(gguf::GgufFile::open(dir + "/qwen3-tiny512-F16.gguf"));
  auto tok = Tokenizer::from_metadata(model->metadata());
  EngineOptions eo;
  eo.n_ctx = 512;
  eo.n_batch = 256;
  eo.n_threads = 2;
  auto engine = Engine::create(model, eo);
  const auto tokens = perplexity_tokens(*tok, gpl_text());
  for (bool process_output : {false, true}) {
    Imatrix im(128);
    ImatrixRunOptions o;
    o.n_ctx = 128;
    o.n_chunks = 3;
    o.process_output = process_output;
    const ImatrixRunResult r = collect_imatrix(*engine, *tok, tokens, im, o);
    EXPECT_EQ(r.n_chunk, 3);
    EXPECT_GT(r.ppl, 100);  // a random model over 512 tokens
    EXPECT_EQ(im.entries().size(), 14u + (process_output ? 1 : 0));  // 7 matrices x 2 layers (+ output)
    EXPECT_EQ(im.entries().count("output.weight"), process_output ? 1u : 0u);
    for (const auto& [name, e] : im.entries()) {
      EXPECT_EQ(e.counts[0], 3 * 128) << name;
      EXPECT_EQ(e.n_cols(), name.find("ffn_down") != std::string::npos ? 768 : 256) << name;
      for (double s : e.sums) EXPECT_GT(s, 0) << name;
    }
    EXPECT_EQ(im.chunk_count(), 3);
    // q, k and v see the same input.
    EXPECT_EQ(im.entries().at("blk.1.attn_q.weight").sums, im.entries().at("blk.1.attn_v.weight").sums);
    // Layer 0's attention input, computed here in float64 from the file: per column, the sum over the 3
    // windows of 128 tokens (the first of each replaced by BOS, as llama-imatrix does) of
    // (rmsnorm(token_embd[t]) * attn_norm)^2.
    {
      const auto& md = model->metadata();
      const double eps = md.get_float("qwen3.attention.layer_norm_rms_epsilon");
      const auto& embd = model->file().tensor("token_embd.weight");
      const auto& norm_t = model->file().tensor("blk.0.attn_norm.weight");
      const int n = (int)embd.row_length();
      std::vector<float> norm_w((size_t)n), row((size_t)n);
      dequantize_row_ref(norm_t.type, norm_t.data, norm_w.data(), n);
      std::vector<double> want((size_t)n, 0.0);
      for (int c = 0; c < 3; ++c)
        for (int i = 0; i < 128; ++i) {
          const int32_t t = i == 0 && tok->add_bos() ? tok->bos() : tokens[(size_t)c * 128 + i];
          dequantize_row_ref(embd.type, embd.data + (size_t)t * dtype_row_bytes(embd.type, n), row.data(), n);
          double ss = 0;
          for (float v : row) ss += (double)v * v;
          const double k = 1.0 / std::sqrt(ss / n + eps);
          for (int j = 0; j < n; ++j) {
            const double x = row[(size_t)j] * k * norm_w[(size_t)j];
            want[(size_t)j] += x * x;
          }
        }
      const auto& got = im.entries().at("blk.0.attn_q.weight").sums;
      ASSERT_EQ(got.size(), want.size());
      double worst = 0;
      for (int j = 0; j < n; ++j) worst = std::max(worst, std::fabs(got[(size_t)j] - want[(size_t)j]) / want[(size_t)j]);
      std::printf("  blk.0.attn_q.weight in_sum2 vs float64: worst relative difference %.3g\n", worst);
      EXPECT_LT(worst, 1e-6);  // measured 2.67e-7 (float32 sums in the engine)
    }
  }
}

// An imatrix from the text lowers the activation-weighted error of the quantized matrices, i.e. the
// error of their products with that text's activations.
TEST(ImatrixTest, ImatrixLowersTheErrorItWeights) {
  ROOFLINE_SHARED_PATH_OR_SKIP(dir, "testdata/models/qwen3-tiny512-llamacpp");
  auto file = gguf::GgufFile::open(dir + "/qwen3-tiny512-F16.gguf");
  auto model = Model::load(file);
  auto tok = Tokenizer::from_metadata(model->metadata());
  EngineOptions eo;
  eo.n_ctx = 512;
  eo.n_threads = 2;
  auto engine = Engine::create(model, eo);
  Imatrix im(128);
  ImatrixRunOptions ro;
  ro.n_ctx = 128;
  collect_imatrix(*engine, *tok, perplexity_tokens(*tok, gpl_text()), im, ro);
  const ImportanceData imp = im.importance("gpl.imatrix");
  // Every tensor's weighted error goes down, by at least about half the smallest gain measured for its
  // type on this build (worst weighted/plain ratio: Q2_K 0.812, Q3_K 0.924, Q4_K 0.972, IQ4_XS 0.965;
  // geometric means 0.76, 0.89, 0.92, 0.93).
  const std::pair<DType, double> cases[] = {{DType::Q2_K, 0.90}, {DType::Q3_K, 0.96}, {DType::Q4_K, 0.985}, {DType::IQ4_XS, 0.98}};
  for (auto [type, max_ratio] : cases) {
    double worst_ratio = 0, sum_log_ratio = 0;
    for (const auto& [name, w] : imp.values) {
      const auto& t = file->tensor(name);
      std::vector<float> x((size_t)t.n_elements()), y(x.size()), z(x.size());
      dequantize_rows_ref(t.type, t.data, x.data(), t.n_rows(), t.row_length());
      std::vector<uint8_t> q(dtype_row_bytes(type, t.row_length()) * t.n_rows());
      auto err = [&](const float* imp_vec, std::vector<float>& out) {
        quantize_rows_ref(type, x.data(), q.data(), t.n_rows(), t.row_length(), imp_vec);
        dequantize_rows_ref(type, q.data(), out.data(), t.n_rows(), t.row_length());
        double e = 0;
        for (size_t i = 0; i < x.size(); ++i) e += w[i % t.row_length()] * (double)(x[i] - out[i]) * (x[i] - out[i]);
        return e;
      };
      const double ratio = err(w.data(), z) / err(nullptr, y);
      worst_ratio = std::max(worst_ratio, ratio);
      sum_log_ratio += std::log(ratio);
      EXPECT_LT(ratio, max_ratio) << dtype_name(type) << " " << name;
    }
    std::printf("  %-7s weighted/plain error over %zu tensors: worst %.4f (bound %.3f), geometric mean %.4f\n", dtype_name(type).c_str(),
                imp.values.size(), worst_ratio, max_ratio, std::exp(sum_log_ratio / (double)imp.values.size()));
  }
}

// quantize --imatrix through the library: the metadata records it, the rules change, it loads back.
TEST(ImatrixTest, QuantizeWithImatrix) {
  ROOFLINE_SHARED_PATH_OR_SKIP(dir, "testdata/models/qwen3-tiny512-llamacpp");
  auto file = gguf::GgufFile::open(dir + "/qwen3-tiny512-F16.gguf");
  const std::string out = test::temp_dir();
  const std::string text = out + "/gpl.txt";
  write_bytes(text, gpl_text());
  auto r = test::run_cli({"imatrix", "-m", dir + "/qwen3-tiny512-F16.gguf", "-f", text, "-o", out + "/im.gguf", "-c", "128", "-t", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = test::run_cli({"imatrix", "-m", dir + "/qwen3-tiny512-F16.gguf", "-f", text, "-o", out + "/im.dat", "-c", "128",
                     "--output-format", "dat", "-t", "2", "--chunks", "5"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Imatrix::load(out + "/im.dat", 128).chunk_count(), 5);
  r = test::run_cli({"quantize", "--imatrix", out + "/im.gguf", dir + "/qwen3-tiny512-F16.gguf", out + "/q.gguf", "IQ4_XS", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto q = gguf::GgufFile::open(out + "/q.gguf");
  EXPECT_EQ(q->metadata().get_string("quantize.imatrix.file"), out + "/im.gguf");
  EXPECT_EQ(q->metadata().get_int("quantize.imatrix.entries_count"), 14);
  // The GPL text's tokens in windows of 128 (-c 128), every whole window.
  const auto tok = Tokenizer::from_metadata(file->metadata());
  const int64_t windows = (int64_t)perplexity_tokens(*tok, gpl_text()).size() / 128;
  EXPECT_GT(windows, 10);
  EXPECT_EQ(q->metadata().get_int("quantize.imatrix.chunks_count"), windows);
  EXPECT_NO_THROW(Model::load(q));
}
