// `roofline convert` failures, through the CLI: each gives exit code 1 and one clear line on stderr,
// and leaves neither the output file nor a temporary file behind (an existing output stays untouched).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "convert_test_util.h"
#include "test_util.h"

using namespace roofline;
namespace fs = std::filesystem;

namespace {

// Runs convert and checks the failure contract; returns the error line.
std::string convert_fails(const std::vector<std::string>& extra, const std::string& out) {
  std::vector<std::string> args = {"convert"};
  args.insert(args.end(), extra.begin(), extra.end());
  args.push_back("-o");
  args.push_back(out);
  const auto r = test::run_cli(args);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  std::string err = r.err;
  while (!err.empty() && err.back() == '\n') err.pop_back();
  EXPECT_EQ(err.find('\n'), std::string::npos) << "more than one line: " << r.err;
  EXPECT_EQ(err.rfind("error: ", 0), 0u) << r.err;
  EXPECT_FALSE(fs::exists(out)) << out;
  for (const auto& e : fs::directory_iterator(fs::path(out).parent_path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << "left behind: " << e.path();
  return err;
}

std::string fresh_dir(const std::string& name) {
  const std::string d = test::temp_dir() + "/" + name;
  fs::create_directories(d);
  return d;
}

}  // namespace

TEST(ConvertErrorsTest, MissingUnexpectedAndMisshapedTensorsAreListed) {
  const std::string dir = fresh_dir("bad-tensors");
  test::SynthHf s;
  auto ts = test::synth_tensors(s);
  std::vector<test::StTensor> kept;
  for (auto& t : ts) {
    if (t.name == "model.layers.1.mlp.up_proj.weight") continue;  // missing
    if (t.name == "model.layers.0.self_attn.k_proj.weight") t.shape = {16, 128}, t.values.resize(16 * 128);  // wrong shape
    kept.push_back(t);
  }
  kept.push_back({"model.layers.0.self_attn.o_proj.bias", "F32", {64}, test::test_values(64, 9)});  // unexpected
  test::write_synth_hf(dir, s, kept);
  const std::string out_dir = fresh_dir("out1");
  const std::string e = convert_fails({dir}, out_dir + "/m.gguf");
  EXPECT_NE(e.find("missing model.layers.1.mlp.up_proj.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("model.layers.0.self_attn.k_proj.weight has shape [16, 128], expected [32, 64]"), std::string::npos) << e;
  EXPECT_NE(e.find("unexpected model.layers.0.self_attn.o_proj.bias"), std::string::npos) << e;
}

TEST(ConvertErrorsTest, UnknownArchitecture) {
  const std::string dir = fresh_dir("gemma2");
  test::SynthHf s;
  s.hf_class = "Gemma2ForCausalLM";
  test::write_synth_hf(dir, s);
  const std::string e = convert_fails({dir}, fresh_dir("out2") + "/m.gguf");
  EXPECT_NE(e.find("architecture 'Gemma2ForCausalLM' is not supported"), std::string::npos) << e;
  EXPECT_NE(e.find("Qwen3ForCausalLM"), std::string::npos) << e;
}

TEST(ConvertErrorsTest, UnknownPreTokenizerPatternAndThePreOverride) {
  const std::string dir = fresh_dir("oddtok");
  test::SynthHf s;
  test::write_synth_hf(dir, s);
  test::write_byte_level_tokenizer(dir, "\\w+|[^\\w\\s]+");
  const std::string out_dir = fresh_dir("out3");
  const std::string e = convert_fails({dir}, out_dir + "/m.gguf");
  EXPECT_NE(e.find("unknown pre-tokenizer regex"), std::string::npos) << e;
  EXPECT_NE(e.find("\\w+|[^\\w\\s]+"), std::string::npos) << e;
  // --pre names the pre-tokenizer to use instead.
  const auto r = test::run_cli({"convert", dir, "-o", out_dir + "/m.gguf", "--pre", "gpt2", "--outtype", "f16"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(out_dir + "/m.gguf"));
}

TEST(ConvertErrorsTest, TruncatedSafetensors) {
  const std::string dir = fresh_dir("trunc");
  test::SynthHf s;
  test::write_synth_hf(dir, s);
  test::write_safetensors(dir + "/model.safetensors", test::synth_tensors(s), 100);
  const std::string e = convert_fails({dir}, fresh_dir("out4") + "/m.gguf");
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
}

TEST(ConvertErrorsTest, BadLlama2cHeaderAndMissingTokenizer) {
  const std::string dir = fresh_dir("l2c");
  const std::string bin = dir + "/model.bin";
  const int32_t header[7] = {64, 172, 5, 8, 3, 512, 512};  // 8 heads, 3 kv heads
  std::ofstream(bin, std::ios::binary).write(reinterpret_cast<const char*>(header), sizeof header);
  const std::string out_dir = fresh_dir("out5");
  std::string e = convert_fails({bin, "--tokenizer", bin}, out_dir + "/m.gguf");
  EXPECT_NE(e.find("n_kv_heads 3"), std::string::npos) << e;
  ROOFLINE_SHARED_PATH_OR_SKIP(sdir, "testdata/models/stories260K");
  e = convert_fails({sdir + "/stories260K.bin"}, out_dir + "/m.gguf");
  EXPECT_NE(e.find("--tokenizer tok.bin"), std::string::npos) << e;
}

TEST(ConvertErrorsTest, ExistingOutputIsKeptOnFailure) {
  const std::string dir = fresh_dir("keep");
  test::SynthHf s;
  s.hf_class = "MysteryForCausalLM";
  test::write_synth_hf(dir, s);
  const std::string out = fresh_dir("out6") + "/m.gguf";
  std::ofstream(out) << "previous";
  const auto r = test::run_cli({"convert", dir, "-o", out});
  EXPECT_EQ(r.exit_code, 1);
  std::ifstream in(out);
  std::string content;
  std::getline(in, content);
  EXPECT_EQ(content, "previous");
}

TEST(ConvertErrorsTest, BadConfigValuesAndMissingFiles) {
  const std::string dir = fresh_dir("badcfg");
  test::SynthHf s;
  s.extra_config = {{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}}};
  test::write_synth_hf(dir, s);
  const std::string out_dir = fresh_dir("out7");
  std::string e = convert_fails({dir}, out_dir + "/m.gguf");
  EXPECT_NE(e.find("rope scaling type 'yarn' is not supported"), std::string::npos) << e;
  fs::remove(dir + "/config.json");
  e = convert_fails({dir}, out_dir + "/m.gguf");
  EXPECT_NE(e.find("no config.json"), std::string::npos) << e;
  e = convert_fails({dir + "/nothing-here"}, out_dir + "/m.gguf");
  EXPECT_NE(e.find("no such file or folder"), std::string::npos) << e;
}
