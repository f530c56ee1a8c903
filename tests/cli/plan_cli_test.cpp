// `roofline plan` as a user runs it: the issue's V100 case, JSON fields, a config.json, the serve
// command line, and bad input as one "error:" line with exit status 1 (values) or 2 (usage).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/gpu.h"
#include "test_util.h"

using namespace roofline;
using roofline::test::run_cli;
using roofline::test::temp_dir;

namespace {

int count_lines(const std::string& s) { return (int)std::count(s.begin(), s.end(), '\n'); }

}  // namespace

TEST(PlanCli, TheV100CaseFitsAndPredictsDecode) {
  auto r = run_cli({"plan", "-m", "synthetic:qwen3.5-27b:Q4_K_M", "--gpu", "v100-32gb", "-c", "8192", "-np", "4", "-ctk", "q8_0", "-ctv",
                    "q8_0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("FITS: 65/65 units"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("predicted: decode"), std::string::npos);
  EXPECT_NE(r.out.find("recurrent state: 12 cells"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("roofline serve -m synthetic:qwen3.5-27b:Q4_K_M -c 8192 -np 4 -ctk q8_0 -ctv q8_0 -ngl all"), std::string::npos)
      << r.out;
}

TEST(PlanCli, TheMtpHeadHasItsOwnLineInTheBill) {
  auto r = run_cli({"plan", "-m", "synthetic:qwen3.5-27b-mtp:Q4_K_M", "--gpu", "v100-32gb", "-c", "8192", "-np", "4", "-ctk", "q8_0",
                    "-ctv", "q8_0", "--spec-type", "draft-mtp", "--draft-max", "4"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("MTP head (draft-mtp)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("MTP head: an engine of its own, 2/2 units on the GPU"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("-ngl all --spec-type draft-mtp --draft-max 4"), std::string::npos) << r.out;
  auto j = run_cli({"plan", "-m", "synthetic:qwen3.5-27b-mtp:Q4_K_M", "--gpu", "rtx4090", "--spec-type", "draft-mtp", "--json"});
  ASSERT_EQ(j.exit_code, 0) << j.err;
  const auto doc = nlohmann::json::parse(j.out);
  EXPECT_GT(doc["bill"][0]["draft_bytes"].get<double>(), 1e9);
  EXPECT_NE(doc["serve_command"].get<std::string>().find("-ngl auto"), std::string::npos) << "the head fits only in part";
  auto none = run_cli({"plan", "-m", "synthetic:qwen3.5-27b:Q4_K_M", "--spec-type", "draft-mtp", "--gpu", "h200"});
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_NE(none.err.find("has no MTP block"), std::string::npos) << none.err;
  EXPECT_EQ(count_lines(none.err), 1) << none.err;
}

TEST(PlanCli, JsonHasTheFieldsScriptsUse) {
  auto r = run_cli({"plan", "-m", "synthetic:qwen3-32b:Q8_0", "--gpu", "rtx4090", "-c", "16384", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_FALSE(j["fits"].get<bool>());  // 32 GiB of weights on a 24 GiB card
  EXPECT_GT(j["n_gpu_layers"].get<int>(), 0);
  EXPECT_LT(j["n_gpu_layers"].get<int>(), 65);
  EXPECT_GT(j["decode_tok_s"].get<double>(), 0);
  EXPECT_GT(j["prefill_tok_s"].get<double>(), 0);
  ASSERT_EQ(j["bill"].size(), 2u);
  double weights = 0;
  for (const auto& b : j["bill"]) {
    EXPECT_NEAR(b["total_bytes"].get<double>(), b["weights_bytes"].get<double>() + b["kv_bytes"].get<double>() + b["state_bytes"].get<double>() +
                                                    b["draft_bytes"].get<double>() + b["work_bytes"].get<double>() + b["context_bytes"].get<double>() +
                                                    b["margin_bytes"].get<double>(), 1);
    weights += b["weights_bytes"].get<double>();
  }
  EXPECT_NEAR(weights / j["model"]["weight_bytes"].get<double>(), 1.0, 0.01);
  EXPECT_FALSE(j["recommendations"].empty());
  EXPECT_NE(j["serve_command"].get<std::string>().find("-ngl " + std::to_string(j["n_gpu_layers"].get<int>())), std::string::npos);
}

TEST(PlanCli, AConfigJsonPlansAsTheSyntheticShapeOfTheSameModel) {
  const std::string dir = temp_dir() + "/plan_cli_qwen3-8b";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << R"({"model_type":"qwen3","hidden_size":4096,"num_hidden_layers":36,"num_attention_heads":32,
    "num_key_value_heads":8,"head_dim":128,"intermediate_size":12288,"vocab_size":151936,"max_position_embeddings":40960,
    "tie_word_embeddings":false})";
  auto a = run_cli({"plan", "-m", dir + "/config.json", "--type", "Q4_K_M", "--gpu", "t4", "-c", "8192", "--json"});
  auto b = run_cli({"plan", "-m", "synthetic:qwen3-8b:Q4_K_M", "--gpu", "t4", "-c", "8192", "--json"});
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  const auto ja = nlohmann::json::parse(a.out), jb = nlohmann::json::parse(b.out);
  EXPECT_EQ(ja["bill"], jb["bill"]);
  EXPECT_EQ(ja["n_gpu_layers"], jb["n_gpu_layers"]);
  EXPECT_NE(ja["prepare_command"].get<std::string>().find("roofline quantize"), std::string::npos);
  // The folder works too; without --type it is a usage error.
  EXPECT_EQ(run_cli({"plan", "-m", dir, "--type", "Q8_0", "--gpu", "t4"}).exit_code, 0);
  auto r = run_cli({"plan", "-m", dir + "/config.json", "--gpu", "t4"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
}

TEST(PlanCli, AGgufFilePlansAsItsSyntheticSpec) {
  const std::string path = temp_dir() + "/plan_cli_tiny35.gguf";
  ASSERT_EQ(run_cli({"synth", "tiny-qwen35:Q4_K_M", "-o", path}).exit_code, 0);
  auto a = run_cli({"plan", "-m", path, "--gpu", "l4", "-c", "1024", "-np", "2", "--json"});
  auto b = run_cli({"plan", "-m", "synthetic:tiny-qwen35:Q4_K_M", "--gpu", "l4", "-c", "1024", "-np", "2", "--json"});
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  const auto ja = nlohmann::json::parse(a.out), jb = nlohmann::json::parse(b.out);
  EXPECT_EQ(ja["bill"], jb["bill"]);
  EXPECT_EQ(ja["recurrent_state"]["cells"].get<int>(), 6);
  EXPECT_NE(ja["serve_command"].get<std::string>().find("roofline serve -m " + path + " -c 1024 -np 2 -ngl all"), std::string::npos);
}

// Speculative decoding keeps a second recurrent state per slot: the plan bills it and the serve line says so.
TEST(PlanCli, SpeculativeDecodingBillsAKeptStatePerSlot) {
  const std::vector<std::string> base = {"plan", "-m", "synthetic:tiny-qwen35-mtp:Q4_K_M", "--gpu", "l4", "-c", "1024", "-np", "2", "--json"};
  auto plain = run_cli(base);
  auto args = base;
  args.insert(args.end(), {"--spec-type", "draft-mtp"});
  auto spec = run_cli(args);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(spec.exit_code, 0) << spec.err;
  const auto jp = nlohmann::json::parse(plain.out), js = nlohmann::json::parse(spec.out);
  EXPECT_EQ(jp["recurrent_state"]["cells"].get<int>(), 6);
  EXPECT_EQ(js["recurrent_state"]["cells"].get<int>(), 8);
  EXPECT_NE(js["serve_command"].get<std::string>().find("--spec-type draft-mtp"), std::string::npos) << js["serve_command"];
}

TEST(PlanCli, BadInputIsOneErrorLine) {
  struct Case {
    std::vector<std::string> args;
    int code;
  };
  const std::string tiny = "synthetic:tiny-qwen3:Q8_0";
  const std::vector<Case> cases = {
      {{"plan", "-m", tiny, "--gpu", "v100"}, 1},
      {{"plan", "-m", tiny, "--gpu", "gtx9999"}, 1},
      {{"plan", "-m", tiny, "--gpu", "t4", "--vram", "0"}, 1},
      {{"plan", "-m", tiny, "--gpu", "t4", "--vram", "-8"}, 1},
      {{"plan", "-m", tiny, "--gpu", "t4", "--vram-limit", "0"}, 1},
      {{"plan", "-m", tiny, "--gpu", "t4", "-c", "-5"}, 1},
      {{"plan", "-m", tiny, "--gpu", "t4", "-np", "0"}, 1},
      {{"plan", "-m", tiny, "--gpu", "t4", "-np", "65537"}, 1},  // 2147483647 slots overflowed the state cells
      {{"plan", "-m", tiny, "--gpu", "t4", "-ctk", "q5_k"}, 1},
      {{"plan", "-m", tiny, "--gpu", "t4", "-ngl", "many"}, 2},
      {{"plan", "-m", tiny, "--gpu", "t4", "--vram", "lots"}, 2},
      {{"plan", "-m", "/nonexistent/config.json", "--type", "Q4_K_M", "--gpu", "t4"}, 1},
      {{"plan", "-m", "/nonexistent.gguf", "--gpu", "t4"}, 1},
      {{"plan", "-m", "synthetic:nope:Q4_K_M", "--gpu", "t4"}, 1},
      {{"plan", "--gpu", "t4"}, 2},
  };
  for (const Case& c : cases) {
    auto r = run_cli(c.args);
    EXPECT_EQ(r.exit_code, c.code) << c.args[c.args.size() - 1] << ": " << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  }
}

// Without a GPU, `plan` (--gpu auto) plans for this machine's CPU: its RAM, its measured read bandwidth
// and product rate, every unit on the host.
TEST(PlanCli, AutoWithoutAGpuPlansForThisCpu) {
  if (!gpu_devices().empty()) GTEST_SKIP() << "this machine has a GPU: --gpu auto plans for it";
  const std::string tiny = "synthetic:tiny-qwen3:Q8_0";
  auto r = run_cli({"plan", "-m", tiny});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("planning for this machine's CPU"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("device:   this machine's CPU"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("read (measured)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("this CPU's products, measured"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("-ngl 0"), std::string::npos) << r.out;
}
