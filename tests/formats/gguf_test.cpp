// GGUF reader/writer: round trips of every metadata type and tensor layout, one test per validation
// rule (each bad file gives one clear Error naming the file and the problem), and reading every
// GGUF file in ../shared through `roofline inspect`.
#include <gtest/gtest.h>

#include <cstring>
#include <dirent.h>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/gguf.h"
#include "test_util.h"

using namespace roofline;
using namespace roofline::gguf;

namespace {

Metadata sample_metadata() {
  Metadata md;
  md.set("general.architecture", Value::string("llama"));
  md.set("a.u8", Value::u8(200));
  md.set("a.i8", Value::i8(-100));
  md.set("a.u16", Value::u16(60000));
  md.set("a.i16", Value::i16(-30000));
  md.set("a.u32", Value::u32(4000000000u));
  md.set("a.i32", Value::i32(-2000000000));
  md.set("a.u64", Value::u64(18000000000000000000ull));
  md.set("a.i64", Value::i64(-9000000000000000000ll));
  md.set("a.f32", Value::f32(1.5f));
  md.set("a.f64", Value::f64(-2.25));
  md.set("a.bool", Value::boolean(true));
  md.set("a.string", Value::string("héllo\nworld"));
  md.set("a.strings", Value::string_array({"x", "", "z\xff"}));
  md.set("a.i32s", Value::i32_array({1, -2, 3}));
  md.set("a.f32s", Value::f32_array({0.5f, -1.0f}));
  md.set("a.bools", Value::bool_array({true, false, true}));
  return md;
}

std::vector<TensorInfo> sample_tensors(std::vector<uint8_t>& storage) {
  storage.resize(1 << 16);
  for (size_t i = 0; i < storage.size(); ++i) storage[i] = (uint8_t)(i * 31 + 7);
  std::vector<TensorInfo> tensors;
  auto add = [&](const char* name, DType type, std::vector<int64_t> shape) {
    TensorInfo t;
    t.name = name;
    t.type = type;
    t.n_dims = (int)shape.size();
    for (size_t i = 0; i < shape.size(); ++i) t.ne[i] = shape[i];
    t.data = storage.data() + tensors.size() * 97;
    tensors.push_back(t);
  };
  add("token_embd.weight", DType::Q4_K, {256, 3});
  add("blk.0.attn_norm.weight", DType::F32, {7});
  add("blk.0.attn_q.weight", DType::Q8_0, {64, 5});
  add("blk.0.x.weight", DType::F16, {3, 2, 2, 2});
  add("empty.weight", DType::F32, {0, 4});
  return tensors;
}

std::vector<uint8_t> valid_file_bytes() {
  std::vector<uint8_t> storage;
  auto tensors = sample_tensors(storage);
  return serialize_gguf(sample_metadata(), tensors);
}

std::string parse_error(const std::vector<uint8_t>& bytes) {
  try {
    GgufFile::parse("bad.gguf", bytes.data(), bytes.size());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Offset of the first tensor-info record (right after the metadata) of valid_file_bytes().
size_t tensor_infos_offset() {
  Metadata md = sample_metadata();
  std::vector<uint8_t> storage;
  auto header = serialize_gguf(md, {});
  return header.size();
}

void put_u32(std::vector<uint8_t>& b, size_t at, uint32_t v) { std::memcpy(b.data() + at, &v, 4); }
void put_u64(std::vector<uint8_t>& b, size_t at, uint64_t v) { std::memcpy(b.data() + at, &v, 8); }

}  // namespace

TEST(GgufTest, RoundTripInMemory) {
  std::vector<uint8_t> storage;
  auto tensors = sample_tensors(storage);
  const Metadata md = sample_metadata();
  auto bytes = serialize_gguf(md, tensors);
  auto file = GgufFile::parse("mem", bytes.data(), bytes.size());
  EXPECT_EQ(file->version(), 3u);
  ASSERT_EQ(file->metadata().size(), md.size());
  for (size_t i = 0; i < md.size(); ++i) {
    const auto& [k, v] = md.entries()[i];
    const auto& [k2, v2] = file->metadata().entries()[i];
    EXPECT_EQ(k, k2);
    EXPECT_EQ(v.type(), v2.type());
    EXPECT_EQ(v.to_display(100), v2.to_display(100)) << k;
  }
  EXPECT_EQ(file->metadata().get_int("a.i64"), -9000000000000000000ll);
  EXPECT_EQ(file->metadata().find("a.u64")->as_uint(), 18000000000000000000ull);
  EXPECT_THROW(file->metadata().find("a.u64")->as_int("a.u64"), Error);
  EXPECT_EQ(file->metadata().get_string("a.string"), "héllo\nworld");
  EXPECT_EQ(file->metadata().find("a.strings")->as_string_array()[2], "z\xff");
  EXPECT_EQ(file->metadata().find("a.i32s")->as_int_array(), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_FLOAT_EQ(file->metadata().get_float("a.f32"), 1.5f);
  ASSERT_EQ(file->tensors().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo& t = file->tensors()[i];
    EXPECT_EQ(t.name, tensors[i].name);
    EXPECT_EQ(t.type, tensors[i].type);
    EXPECT_EQ(t.ne, tensors[i].ne);
    EXPECT_EQ(t.offset % 32, 0u);
    ASSERT_EQ(t.n_bytes, tensor_bytes(tensors[i].type, tensors[i].ne));
    EXPECT_EQ(0, std::memcmp(t.data, tensors[i].data, t.n_bytes)) << t.name;
  }
  EXPECT_EQ(file->tensor("blk.0.attn_q.weight").n_bytes, 5u * 2 * 34);
  EXPECT_THROW(file->tensor("missing"), Error);
  // Serializing what was read gives the same bytes.
  EXPECT_EQ(serialize_gguf(file->metadata(), file->tensors()), bytes);
}

TEST(GgufTest, WriterStreamsAndRenamesAtTheEnd) {
  std::vector<uint8_t> storage;
  auto tensors = sample_tensors(storage);
  const std::string path = test::temp_dir() + "/w.gguf";
  {
    std::vector<GgufWriter::TensorSpec> specs;
    for (auto& t : tensors) specs.push_back({t.name, t.type, std::vector<int64_t>(t.ne.begin(), t.ne.begin() + t.n_dims)});
    GgufWriter w(path, sample_metadata(), specs, 64);
    // An unfinished writer leaves nothing at the destination.
    std::ifstream probe(path);
    EXPECT_FALSE(probe.good());
    for (size_t i = 0; i < tensors.size(); ++i) {
      const size_t n = w.tensor_bytes_at(i);
      // Two partial writes per tensor.
      if (n == 0) {
        w.write_tensor_data(i, nullptr, 0);  // an empty tensor is complete at once
        continue;
      }
      w.write_tensor_data(i, tensors[i].data, n / 2);
      w.write_tensor_data(i, tensors[i].data + n / 2, n - n / 2);
    }
    EXPECT_THROW(w.write_tensor_data(0, storage.data(), 1), Error);
    w.finish();
  }
  auto file = GgufFile::open(path);
  EXPECT_EQ(file->alignment(), 64u);
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(file->tensors()[i].offset % 64, 0u);
    EXPECT_EQ(0, std::memcmp(file->tensors()[i].data, tensors[i].data, file->tensors()[i].n_bytes));
  }
}

TEST(GgufTest, AbandonedWriterRemovesItsTemporaryFile) {
  const std::string dir = test::temp_dir();
  {
    GgufWriter w(dir + "/x.gguf", sample_metadata(), {{"a.weight", DType::F32, {4}}});
  }
  DIR* d = opendir(dir.c_str());
  int entries = 0;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++entries;
  closedir(d);
  EXPECT_EQ(entries, 0);
}

TEST(GgufTest, WriterRejectsBadTensors) {
  const std::string dir = test::temp_dir();
  EXPECT_THROW(GgufWriter(dir + "/a.gguf", {}, {{"x", DType::Q4_K, {100}}}), Error);           // not whole blocks
  EXPECT_THROW(GgufWriter(dir + "/b.gguf", {}, {{"x", DType::F32, {1}}, {"x", DType::F32, {1}}}), Error);  // duplicate
  EXPECT_THROW(GgufWriter(dir + "/c.gguf", {}, {{std::string(64, 'n'), DType::F32, {1}}}), Error);  // name too long
  EXPECT_THROW(GgufWriter(dir + "/d.gguf", {}, {{"x", DType::F32, {1, 1, 1, 1, 1}}}), Error);  // 5 dims
}

TEST(GgufTest, ErrorsNameTheFileAndTheProblem) {
  const auto good = valid_file_bytes();
  ASSERT_EQ(parse_error(good), "");

  auto expect_error = [](std::vector<uint8_t> b, const std::string& needle) {
    const std::string e = parse_error(b);
    EXPECT_NE(e.find("bad.gguf: "), std::string::npos) << e;
    EXPECT_NE(e.find(needle), std::string::npos) << "expected '" << needle << "' in: " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << "one line: " << e;
  };

  {  // magic
    auto b = good;
    b[0] = 'X';
    expect_error(b, "bad magic");
  }
  {  // versions
    auto b = good;
    put_u32(b, 4, 1);
    expect_error(b, "version 1");
    put_u32(b, 4, 4);
    expect_error(b, "unsupported GGUF version 4");
    put_u32(b, 4, 0x03000000);
    expect_error(b, "big-endian");
    put_u32(b, 4, 2);
    EXPECT_EQ(parse_error(b), "");  // v2 reads like v3
  }
  // truncation anywhere in the header
  for (size_t cut : {3ul, 10ul, 30ul, 100ul, tensor_infos_offset() + 5}) {
    auto b = good;
    b.resize(cut);
    const std::string e = parse_error(b);
    EXPECT_TRUE(e.find("truncated") != std::string::npos || e.find("too small") != std::string::npos) << cut << ": " << e;
  }
  {  // truncated data section
    auto b = good;
    b.resize(b.size() - 40);
    expect_error(b, "out of range");
  }
  {  // absurd counts
    auto b = good;
    put_u64(b, 8, 1ull << 40);
    expect_error(b, "truncated");
    b = good;
    put_u64(b, 16, (uint64_t)-5);
    expect_error(b, "negative metadata count");
  }
  {  // duplicate key: rename the second key to the first (same length keys "a.u8"/"a.i8")
    auto b = good;
    const std::string s(b.begin(), b.end());
    const size_t at = s.find("a.i8");
    ASSERT_NE(at, std::string::npos);
    b[at + 2] = 'u';
    expect_error(b, "duplicate metadata key 'a.u8'");
  }
  {  // wrong metadata type: general.alignment as a string
    Metadata md = sample_metadata();
    md.set("general.alignment", Value::string("32"));
    std::vector<uint8_t> storage;
    auto tensors = sample_tensors(storage);
    // serialize_gguf would rewrite the alignment key; build the header by hand through a file image.
    Metadata md2 = sample_metadata();
    md2.set("general.alignmenX", Value::string("32"));
    auto b = serialize_gguf(md2, tensors);
    const std::string s(b.begin(), b.end());
    b[s.find("general.alignmenX") + 16] = 't';
    expect_error(b, "general.alignment has type string");
  }
  {  // unknown value type
    auto b = good;
    const std::string s(b.begin(), b.end());
    const size_t at = s.find("a.u8") + 4;
    put_u32(b, at, 77);
    expect_error(b, "unknown value type 77");
  }
  const size_t ti = tensor_infos_offset();
  // First tensor info: u64 len, "token_embd.weight" (17), u32 n_dims, 2 x i64, u32 type, u64 offset
  const size_t name_at = ti + 8, ndims_at = ti + 8 + 17, ne0_at = ndims_at + 4, type_at = ne0_at + 16, off_at = type_at + 4;
  {
    auto b = good;
    put_u32(b, type_at, 4);  // removed type id
    expect_error(b, "unknown type id 4");
  }
  {
    auto b = good;
    put_u32(b, ndims_at, 5);
    expect_error(b, "5 dimensions");
  }
  {
    auto b = good;
    put_u64(b, ne0_at, 100);  // Q4_K rows must be multiples of 256
    expect_error(b, "not a multiple");
  }
  {
    auto b = good;
    put_u64(b, ne0_at, 1ull << 62);
    put_u64(b, ne0_at + 8, 1ull << 20);
    expect_error(b, "overflow");
  }
  {
    auto b = good;
    put_u64(b, ne0_at + 8, (uint64_t)-3);
    expect_error(b, "negative dimension");
  }
  {
    auto b = good;
    put_u64(b, off_at, 3);
    expect_error(b, "not aligned");
  }
  {
    auto b = good;
    put_u64(b, off_at, 1ull << 40);
    expect_error(b, "out of range");
  }
  {  // second tensor (blk.0.attn_norm.weight) moved onto the first: overlap
    auto b = good;
    const std::string s(b.begin(), b.end());
    const size_t t2 = s.find("blk.0.attn_norm.weight");
    const size_t t2_off = t2 + 22 + 4 + 8 + 4;
    put_u64(b, t2_off, 0);
    expect_error(b, "overlap");
  }
  {  // duplicate tensor: rename token_embd -> blk.0.attn_norm... lengths differ, so rename the 4th onto the 3rd
    auto b = good;
    const std::string s(b.begin(), b.end());
    const size_t at = s.find("blk.0.x.weight");
    // "blk.0.x.weight" -> "blk.0.q.weight" is not a duplicate; make "empty.weight" equal "blk.0.x.weight"? use names of
    // equal length instead: turn "blk.0.x.weight" into "blk.0.q.weight" and check no error, then test duplicates below.
    b[at + 6] = 'q';
    EXPECT_EQ(parse_error(b), "");
  }
  {  // over-long tensor name
    Metadata md;
    std::vector<uint8_t> storage(64);
    TensorInfo t;
    t.name = std::string(63, 'a');
    t.type = DType::F32;
    t.ne = {4, 1, 1, 1};
    t.data = storage.data();
    auto b = serialize_gguf(md, {t});
    EXPECT_EQ(parse_error(b), "");
    const std::string s(b.begin(), b.end());
    // grow the name to 64 bytes by rewriting its length and inserting a byte
    const size_t len_at = s.find(std::string(63, 'a')) - 8;
    put_u64(b, len_at, 64);
    b.insert(b.begin() + (ptrdiff_t)len_at + 8, 'a');
    expect_error(b, "longer than the limit");
  }
  {  // duplicate tensor names
    Metadata md;
    std::vector<uint8_t> storage(64);
    TensorInfo t;
    t.name = "aa";
    t.type = DType::F32;
    t.ne = {4, 1, 1, 1};
    t.data = storage.data();
    TensorInfo u = t;
    u.name = "ab";
    auto b = serialize_gguf(md, {t, u});
    const std::string s(b.begin(), b.end());
    b[s.find("ab")] = 'a';
    b[s.find("ab") + 1] = 'a';
    expect_error(b, "duplicate tensor 'aa'");
  }
  {  // arrays of arrays and bad bools
    Metadata md;
    md.set("x.arr", Value::i32_array({1}));
    md.set("x.b", Value::boolean(true));
    auto b = serialize_gguf(md, {});
    const std::string s(b.begin(), b.end());
    auto nested = b;
    put_u32(nested, s.find("x.arr") + 5 + 4, 9);
    expect_error(nested, "array of arrays");
    auto badbool = b;
    badbool[s.find("x.b") + 3 + 4] = 2;
    expect_error(badbool, "bool value 2");
  }
  (void)name_at;
}

TEST(GgufTest, MetadataGettersCheckTypes) {
  Metadata md = sample_metadata();
  EXPECT_EQ(md.get_int("a.u32"), 4000000000ll);
  EXPECT_EQ(md.get_int_or("missing", 7), 7);
  EXPECT_THROW(md.get_int("a.string"), Error);
  EXPECT_THROW(md.get_string("a.u32"), Error);
  EXPECT_THROW(md.get_int("missing"), Error);
  EXPECT_DOUBLE_EQ(md.get_float("a.u8"), 200.0);  // integers read as numbers
  try {
    md.get_int("a.f32");
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "metadata key 'a.f32' has type f32, expected an integer");
  }
  md.set("a.u8", Value::u8(1));  // replace keeps the position
  EXPECT_EQ(md.entries()[1].first, "a.u8");
  EXPECT_TRUE(md.erase("a.u8"));
  EXPECT_FALSE(md.contains("a.u8"));
  EXPECT_EQ(md.get_int("a.i8"), -100);
}

TEST(GgufTest, ReadsTheSharedModelFiles) {
  ROOFLINE_SHARED_PATH_OR_SKIP(dir, "testdata/models/qwen3-tiny512-llamacpp");
  auto file = GgufFile::open(dir + "/qwen3-tiny512-Q4_K_M.gguf");
  EXPECT_EQ(file->metadata().get_string("general.architecture"), "qwen3");
  EXPECT_EQ(file->tensor("output.weight").type, DType::Q6_K);
  EXPECT_EQ(file->tensor("token_embd.weight").ne[1], 512);
  EXPECT_EQ(file->data_offset() % 32, 0u);
  auto tiny = GgufFile::open(test::shared_dir() + "/testdata/models/llama-2-tiny-random-gguf/llama-2-tiny-random.gguf");
  EXPECT_EQ(tiny->tensors().size(), 12u);
  EXPECT_EQ(tiny->metadata().find("tokenizer.ggml.tokens")->array_size(), 32000u);
  EXPECT_EQ(tiny->metadata().get_int("llama.embedding_length"), 8);
}

TEST(GgufTest, MissingFileIsAnError) {
  try {
    GgufFile::open("/nonexistent/x.gguf");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/x.gguf: cannot open"), std::string::npos);
  }
}

TEST(InspectCommandTest, EverySharedGgufFile) {
  ROOFLINE_SHARED_PATH_OR_SKIP(models, "testdata/models");
  std::vector<std::string> files;
  for (const char* sub : {"/qwen3-tiny512-llamacpp", "/llama-2-tiny-random-gguf"}) {
    DIR* d = opendir((models + sub).c_str());
    ASSERT_NE(d, nullptr);
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n.size() > 5 && n.substr(n.size() - 5) == ".gguf") files.push_back(models + sub + "/" + n);
    }
    closedir(d);
  }
  for (const std::string& vocab : {"ggml-vocab-llama-spm.gguf.xz", "ggml-vocab-gpt-2.gguf.xz", "ggml-vocab-phi-3.gguf.xz"})
    files.push_back(test::unxz_to_temp(test::shared_dir() + "/testdata/tokenizer/gguf-vocabs/" + vocab));
  ASSERT_GE(files.size(), 15u);
  for (const std::string& f : files) {
    auto text = test::run_cli({"inspect", f});
    EXPECT_EQ(text.exit_code, 0) << f << ": " << text.err;
    EXPECT_NE(text.out.find("general.architecture"), std::string::npos) << f;
    auto json = test::run_cli({"inspect", f, "--json"});
    ASSERT_EQ(json.exit_code, 0) << f << ": " << json.err;
    auto j = nlohmann::json::parse(json.out);
    ASSERT_TRUE(j.contains("metadata") && j.contains("tensors"));
    auto file = GgufFile::open(f);
    ASSERT_EQ(j["tensors"].size(), file->tensors().size());
    for (size_t i = 0; i < file->tensors().size(); ++i) {
      const auto& t = file->tensors()[i];
      const auto& jt = j["tensors"][i];
      EXPECT_EQ(jt["name"], t.name);
      EXPECT_EQ(jt["type"], dtype_name(t.type));
      EXPECT_EQ(jt["bytes"], t.n_bytes);
      EXPECT_EQ(jt["offset"], file->data_offset() + t.offset);
      EXPECT_EQ(jt["shape"].size(), (size_t)t.n_dims);
    }
    EXPECT_EQ(j["metadata"]["general.architecture"], file->metadata().get_string("general.architecture"));
  }
}

TEST(InspectCommandTest, BadFilesGiveOneLineErrors) {
  const std::string dir = test::temp_dir();
  {
    std::ofstream f(dir + "/junk.gguf", std::ios::binary);
    f << "this is not a gguf file at all";
  }
  auto r = test::run_cli({"inspect", dir + "/junk.gguf"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "error: " + dir + "/junk.gguf: bad magic (not a GGUF file)\n");
  r = test::run_cli({"inspect", dir + "/missing.gguf"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("cannot open"), std::string::npos);
}
