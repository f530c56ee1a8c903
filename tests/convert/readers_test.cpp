// The safetensors reader (dtypes, header validation, truncation, overlaps, sharded folders with and
// without an index) and the llama2.c checkpoint reader (stories260K's header and layout, bad headers,
// wrong sizes, newer export versions).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "convert_test_util.h"
#include "core/error.h"
#include "formats/llama2c.h"
#include "formats/safetensors.h"
#include "test_util.h"

using namespace roofline;
namespace fs = std::filesystem;

namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void write_bytes(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

std::string raw_safetensors(const std::string& header, size_t data_bytes) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = (char)((header.size() >> (8 * i)) & 0xff);
  return s + header + std::string(data_bytes, '\0');
}

}  // namespace

TEST(SafetensorsTest, ReadsFloatTypesExactly) {
  const std::string dir = test::temp_dir();
  const std::vector<float> vals = {1.0f, -2.5f, 0.333333f, 65504.0f, 1e-3f, -0.0f};
  test::write_safetensors(dir + "/a.safetensors", {{"x32", "F32", {2, 3}, vals}, {"x16", "F16", {6}, vals}, {"xb", "BF16", {3, 2}, vals}});
  auto f = safetensors::SafetensorsFile::open(dir + "/a.safetensors");
  ASSERT_EQ(f->tensors().size(), 3u);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  const auto* t = f->find("x32");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->type, DType::F32);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t->shape_string(), "[2, 3]");
  std::vector<float> got(6);
  safetensors::tensor_to_f32(*t, 0, 6, got.data());
  EXPECT_EQ(got, vals);
  safetensors::tensor_to_f32(*f->find("x16"), 0, 6, got.data());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(got[i], round_to_fp16(vals[i]));
  safetensors::tensor_to_f32(*f->find("xb"), 2, 3, got.data());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(got[i], bf16_to_f32(f32_to_bf16(vals[2 + i])));
  EXPECT_EQ(f->tensors()[0].name, "x32");  // header order kept
}

TEST(SafetensorsTest, RejectsMalformedFilesNamingThem) {
  const std::string dir = test::temp_dir();
  const std::string p = dir + "/bad.safetensors";
  // Truncated data.
  test::write_safetensors(p, {{"w", "F32", {4, 4}, test::test_values(16, 1)}}, 4);
  std::string e = error_of([&] { safetensors::SafetensorsFile::open(p); });
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  EXPECT_NE(e.find(p), std::string::npos) << e;
  // Unsupported dtype.
  write_bytes(p, raw_safetensors(R"({"w":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})", 16));
  e = error_of([&] { safetensors::SafetensorsFile::open(p); });
  EXPECT_NE(e.find("I64"), std::string::npos) << e;
  EXPECT_NE(e.find("F32, F16, BF16"), std::string::npos) << e;
  // Size that does not match the shape.
  write_bytes(p, raw_safetensors(R"({"w":{"dtype":"F16","shape":[3],"data_offsets":[0,8]}})", 8));
  e = error_of([&] { safetensors::SafetensorsFile::open(p); });
  EXPECT_NE(e.find("needs 6 bytes"), std::string::npos) << e;
  // Overlapping ranges.
  write_bytes(p, raw_safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12));
  e = error_of([&] { safetensors::SafetensorsFile::open(p); });
  EXPECT_NE(e.find("overlap"), std::string::npos) << e;
  // Header length beyond the file, bad JSON, a too-short file, negative dims.
  std::string huge = raw_safetensors("{}", 0);
  huge[0] = (char)0xff;
  huge[1] = (char)0x7f;
  write_bytes(p, huge);
  EXPECT_NE(error_of([&] { safetensors::SafetensorsFile::open(p); }).find("header"), std::string::npos);
  write_bytes(p, raw_safetensors("{\"w\":", 0));
  EXPECT_NE(error_of([&] { safetensors::SafetensorsFile::open(p); }).find("JSON"), std::string::npos);
  write_bytes(p, "abc");
  EXPECT_NE(error_of([&] { safetensors::SafetensorsFile::open(p); }).find("too short"), std::string::npos);
  write_bytes(p, raw_safetensors(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,0]}})", 0));
  EXPECT_NE(error_of([&] { safetensors::SafetensorsFile::open(p); }).find("bad dimension"), std::string::npos);
}

TEST(SafetensorsTest, FolderWithIndexAndShards) {
  const std::string dir = test::temp_dir() + "/model";
  fs::create_directories(dir);
  test::write_safetensors(dir + "/model-00001-of-00002.safetensors", {{"a", "F32", {2}, {1, 2}}, {"b", "F16", {1}, {3}}});
  test::write_safetensors(dir + "/model-00002-of-00002.safetensors", {{"c", "BF16", {2}, {4, 5}}});
  std::ofstream(dir + "/model.safetensors.index.json")
      << R"({"metadata":{"total_size":14},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00001-of-00002.safetensors","c":"model-00002-of-00002.safetensors"}})";
  auto m = safetensors::SafetensorsModel::open_folder(dir);
  EXPECT_EQ(m.tensors().size(), 3u);
  ASSERT_NE(m.find("c"), nullptr);
  EXPECT_EQ(m.find("c")->type, DType::BF16);
  EXPECT_EQ(m.files().size(), 2u);

  // The index names a tensor the shard lacks.
  std::ofstream(dir + "/model.safetensors.index.json")
      << R"({"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00001-of-00002.safetensors","c":"model-00002-of-00002.safetensors","d":"model-00002-of-00002.safetensors"}})";
  std::string e = error_of([&] { safetensors::SafetensorsModel::open_folder(dir); });
  EXPECT_NE(e.find("d (listed in the index"), std::string::npos) << e;
  // A missing shard.
  fs::remove(dir + "/model-00002-of-00002.safetensors");
  e = error_of([&] { safetensors::SafetensorsModel::open_folder(dir); });
  EXPECT_NE(e.find("missing"), std::string::npos) << e;
  // Without an index: every *.safetensors; a tensor in two files is an error.
  fs::remove(dir + "/model.safetensors.index.json");
  test::write_safetensors(dir + "/extra.safetensors", {{"a", "F32", {2}, {1, 2}}});
  e = error_of([&] { safetensors::SafetensorsModel::open_folder(dir); });
  EXPECT_NE(e.find("in both"), std::string::npos) << e;
  // An empty folder.
  const std::string empty = test::temp_dir() + "/empty";
  fs::create_directories(empty);
  e = error_of([&] { safetensors::SafetensorsModel::open_folder(empty); });
  EXPECT_NE(e.find("no *.safetensors"), std::string::npos) << e;
}

TEST(Llama2cTest, ReadsStories260K) {
  ROOFLINE_SHARED_PATH_OR_SKIP(path, "testdata/models/stories260K/stories260K.bin");
  auto ck = llama2c::Checkpoint::open(path);
  const auto& c = ck->config();
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.seq_len, 512);
  EXPECT_TRUE(c.shared_classifier);
  EXPECT_EQ(llama2c::Checkpoint::expected_size(c), 28u + 264128u * 4u);
  EXPECT_EQ(ck->layer("wk", 4).shape, (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(ck->layer("w2", 0).shape, (std::vector<int64_t>{64, 172}));
  EXPECT_EQ(ck->classifier().data, ck->tok_embeddings().data);
  // The last layer's w3 ends where rms_final starts.
  const auto w3 = ck->layer("w3", 4);
  EXPECT_EQ(w3.data + w3.n_elements() * 4, ck->rms_final().data);
}

TEST(Llama2cTest, RejectsBadFiles) {
  const std::string dir = test::temp_dir();
  const std::string p = dir + "/m.bin";
  auto write_header = [&](std::vector<int32_t> h, size_t floats) {
    std::string s(reinterpret_cast<const char*>(h.data()), h.size() * 4);
    s += std::string(floats * 4, '\0');
    write_bytes(p, s);
  };
  write_header({0, 172, 5, 8, 4, 512, 512}, 100);
  std::string e = error_of([&] { llama2c::Checkpoint::open(p); });
  EXPECT_NE(e.find("dim = 0"), std::string::npos) << e;
  write_header({64, 172, 5, 6, 4, 512, 512}, 100);
  EXPECT_NE(error_of([&] { llama2c::Checkpoint::open(p); }).find("not a multiple"), std::string::npos);
  write_bytes(p, "short");
  EXPECT_NE(error_of([&] { llama2c::Checkpoint::open(p); }).find("28-byte header"), std::string::npos);
  write_header({0x616b3432, 2, 0, 0, 0, 0, 0}, 10);
  EXPECT_NE(error_of([&] { llama2c::Checkpoint::open(p); }).find("version 2"), std::string::npos);
  // The right header with a wrong size; and a size that fits the other sign of vocab_size.
  llama2c::Config c;
  c.dim = 16, c.hidden_dim = 24, c.n_layers = 1, c.n_heads = 2, c.n_kv_heads = 1, c.vocab_size = 10, c.seq_len = 8;
  const size_t shared_floats = (llama2c::Checkpoint::expected_size(c) - 28) / 4;
  write_header({16, 24, 1, 2, 1, 10, 8}, shared_floats - 3);
  e = error_of([&] { llama2c::Checkpoint::open(p); });
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  write_header({16, 24, 1, 2, 1, 10, 8}, shared_floats + 160);
  e = error_of([&] { llama2c::Checkpoint::open(p); });
  EXPECT_NE(e.find("sign of vocab_size"), std::string::npos) << e;
  write_header({16, 24, 1, 2, 1, -10, 8}, shared_floats + 160);
  auto ck = llama2c::Checkpoint::open(p);
  EXPECT_FALSE(ck->config().shared_classifier);
  EXPECT_NE(ck->classifier().data, ck->tok_embeddings().data);
}
