// `roofline run` and `roofline bench` with a draft model (-md): run prints the same text as without a
// draft (greedy, and seeded sampling) and a line with the draft's acceptance; bench's tg decodes after
// a text prompt and reports the acceptance (table line and JSON); a Qwen3.5 target (recurrent states)
// with a draft model or its own MTP head (--spec-type draft-mtp) prints the same text; bad draft flags
// (an MTP head asked of a file without one) are one-line errors.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace roofline::test {
namespace {

const char* kTarget = "synthetic:tiny-qwen3:Q4_K_M";

TEST(SpeculativeCli, RunPrintsTheSameTextWithADraft) {
  for (const std::vector<std::string>& sampling : {std::vector<std::string>{"--temp", "0"},
                                                   std::vector<std::string>{"--temp", "0.9", "-s", "42", "--top-k", "0"}}) {
    std::vector<std::string> base = {"run", "-m", kTarget, "-p", "Once upon a time", "-n", "37"};
    base.insert(base.end(), sampling.begin(), sampling.end());
    const auto plain = run_cli(base);
    ASSERT_EQ(plain.exit_code, 0) << plain.err;
    for (const char* draft : {kTarget, "synthetic:tiny-llama:Q8_0:3"}) {
      auto args = base;
      for (const char* a : {"-md", draft, "--draft-max", "5"}) args.push_back(a);
      const auto spec = run_cli(args);
      ASSERT_EQ(spec.exit_code, 0) << spec.err;
      EXPECT_EQ(spec.out, plain.out) << draft;
      // The same number of tokens (37, or fewer where the sampled text reaches the end of generation).
      const auto generated = [](const std::string& err) { return err.substr(err.find("| generation: "), 22); };
      EXPECT_EQ(generated(spec.err), generated(plain.err)) << spec.err;
      EXPECT_NE(spec.err.find("draft tokens accepted"), std::string::npos) << spec.err;
      if (std::string(draft) == kTarget && sampling[1] == "0") EXPECT_NE(spec.err.find("(100.0%)"), std::string::npos) << spec.err;
    }
  }
}

TEST(SpeculativeCli, BenchReportsTheAcceptance) {
  const std::string prompt = temp_dir() + "/spec_prompt.txt";
  std::ofstream(prompt) << "The quick brown fox jumps over the lazy dog. The quick brown fox";
  const auto r = run_cli({"bench", "-m", kTarget, "-md", kTarget, "--draft-max", "3", "-p", "0", "-n", "16", "-r", "1", "-t", "1",
                          "--prompt-file", prompt, "-o", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 1u) << r.out;
  EXPECT_NE(j[0]["test"].get<std::string>().find("tg16 @ p"), std::string::npos) << j[0]["test"];
  EXPECT_NE(j[0]["test"].get<std::string>().find("+md3"), std::string::npos) << j[0]["test"];
  EXPECT_GT(j[0]["draft_n"].get<int>(), 0);
  EXPECT_EQ(j[0]["draft_n_accepted"], j[0]["draft_n"]) << "the target as its own draft";
  EXPECT_GT(j[0]["avg_ts"].get<double>(), 0);
  const auto md = run_cli({"bench", "-m", kTarget, "-md", "synthetic:tiny-llama:Q8_0", "-p", "0", "-n", "8", "-r", "1", "-t", "1"});
  ASSERT_EQ(md.exit_code, 0) << md.err;
  EXPECT_NE(md.out.find("draft acceptance "), std::string::npos) << md.out;
  const auto text = run_cli({"bench", "-m", kTarget, "-p", "0", "-n", "8", "-r", "1", "-t", "1", "--prompt-file", prompt});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("tg8 @ p"), std::string::npos) << text.out;
  EXPECT_EQ(text.out.find("draft acceptance"), std::string::npos) << text.out;
}

TEST(SpeculativeCli, BadDraftFlagsAreOneLineErrors) {
  auto r = run_cli({"run", "-m", kTarget, "-md", "synthetic:qwen3-0.6b:Q4_K_M", "-p", "x", "-n", "2"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err.substr(r.err.rfind("error:")),
            "error: the draft model's vocabulary has 151936 tokens, the target's 512: a draft must share the target's vocabulary\n");
  r = run_cli({"run", "-m", kTarget, "-md", kTarget, "--draft-max", "0", "-p", "x"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "error: --draft-max 0: expected at least 1\n");
  r = run_cli({"run", "-m", kTarget, "-md", kTarget, "--draft-p-min", "1.5", "-p", "x"});
  EXPECT_EQ(r.err, "error: --draft-p-min 1.5: expected 0..1\n");
  r = run_cli({"run", "-m", kTarget, "-md", kTarget, "-ngld", "lots", "-p", "x"});
  EXPECT_EQ(r.exit_code, 2);
  r = run_cli({"run", "-m", "synthetic:tiny-qwen35:Q8_0", "--spec-type", "draft-mtp", "-p", "x", "-n", "2"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("has no MTP block (qwen35.nextn_predict_layers is 0)"), std::string::npos) << r.err;
  const std::string line = r.err.substr(r.err.find("error:"));
  EXPECT_EQ(line.find('\n'), line.size() - 1) << "one line, the last: " << r.err;
  r = run_cli({"run", "-m", "synthetic:tiny-qwen35-mtp:Q8_0", "--spec-type", "draft-mtp", "-md", kTarget, "-p", "x"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("error: --spec-type draft-mtp drafts with the model's own MTP head: leave out -md"), std::string::npos) << r.err;
}

// A recurrent target (Qwen3.5) drafts with a draft model and with its own MTP head: the same text.
TEST(SpeculativeCli, RecurrentTargetPrintsTheSameText) {
  const std::vector<std::string> base = {"run", "-m", "synthetic:tiny-qwen35-mtp:Q8_0", "-p", "Once upon a time", "-n", "24", "--temp", "0"};
  const auto plain = run_cli(base);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  for (const std::vector<std::string>& extra : {std::vector<std::string>{"-md", kTarget}, std::vector<std::string>{"--spec-type", "draft-mtp"},
                                                std::vector<std::string>{"-md", "synthetic:tiny-qwen35-mtp:Q8_0"}}) {
    auto args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    for (const char* a : {"--draft-max", "3"}) args.push_back(a);
    const auto spec = run_cli(args);
    if (extra[1] == "synthetic:tiny-qwen35-mtp:Q8_0") {  // a recurrent model cannot be the draft
      EXPECT_EQ(spec.exit_code, 1);
      EXPECT_NE(spec.err.find("the draft model has recurrent"), std::string::npos) << spec.err;
      continue;
    }
    ASSERT_EQ(spec.exit_code, 0) << spec.err;
    EXPECT_EQ(spec.out, plain.out) << extra[1];
    EXPECT_NE(spec.err.find("draft tokens accepted"), std::string::npos) << spec.err;
  }
  const auto bench = run_cli({"bench", "-m", "synthetic:tiny-qwen35-mtp:Q8_0", "--spec-type", "draft-mtp", "-p", "0", "-n", "8", "-r", "1",
                              "-t", "1", "-o", "json"});
  ASSERT_EQ(bench.exit_code, 0) << bench.err;
  EXPECT_NE(bench.out.find("+mtp3"), std::string::npos) << bench.out;
}

}  // namespace
}  // namespace roofline::test
