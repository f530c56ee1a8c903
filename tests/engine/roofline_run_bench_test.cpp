// The roofline model (the denominator of bench's "% of roofline") against bytes and FLOPs counted by
// hand from the tiny shapes; `roofline bench`'s JSON arithmetic (GB/s, roofline t/s and %, TFLOP/s)
// from those numbers; `roofline run` printing llama2.c's own greedy story for stories260K.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <regex>

#include "engine/roofline_model.h"
#include "model/model_file.h"
#include "engine/engine_test_util.h"
#include "test_util.h"

using namespace roofline;
using test::tiny;

namespace {

// tiny-qwen3 (model_shapes.cpp): n_embd 256, 2 layers, 4 heads / 2 KV heads of 64, n_ff 768, vocab 512,
// untied output. In F32, floats a decode token reads:
//   output 512*256 + output_norm 256
//   per layer: q 256*256, k 256*128, v 256*128, o 256*256, gate/up/down 3*256*768, attn_norm 256,
//              ffn_norm 256, q_norm 64, k_norm 64 = 787072
//   one embedding row 256
constexpr double kTinyQwen3F32Bytes = 4.0 * (512 * 256 + 256 + 2 * 787072 + 256);  // 6822912
// KV per position: 2 layers x (K + V rows of 2 x 64 = 128 values).
constexpr double kTinyQwen3KvF16 = 2 * (128 * 2 + 128 * 2);              // 1024
constexpr double kTinyQwen3KvQ8_0 = 2 * (4 * 34 + 4 * 34);                // 544: 4 blocks of 32 per row
constexpr double kTinyQwen3KvQ4_0 = 2 * (4 * 18 + 4 * 18);                // 288
// FLOPs per token at depth d: 2 x (weights' multiply-adds + attention's q.k and p.v over d + 1 keys).
// with_output: the output matrix's 256 x 512 (a decode row's logits; a prompt's rows leave it out).
double tiny_qwen3_flops(double d, bool with_output = true) {
  const double weights = (with_output ? 256.0 * 512 : 0.0) + 2 * (3 * 256.0 * 768 + 256.0 * (256 + 128 + 128) + 256.0 * 256);
  return 2 * (weights + 2 * 4 * (64 + 64) * (d + 1));
}

}  // namespace

TEST(RooflineModelTest, BytesAndFlopsOfTinyShapesByHand) {
  auto m = tiny("tiny-qwen3:F32");
  EXPECT_EQ(decode_bytes_per_token(*m, 0, DType::F16, DType::F16), kTinyQwen3F32Bytes);
  EXPECT_EQ(decode_bytes_per_token(*m, 100, DType::F16, DType::F16), kTinyQwen3F32Bytes + 100 * kTinyQwen3KvF16);
  EXPECT_EQ(kv_bytes_per_position(*m, DType::F16, DType::F16), kTinyQwen3KvF16);
  EXPECT_EQ(kv_bytes_per_position(*m, DType::Q8_0, DType::Q8_0), kTinyQwen3KvQ8_0);
  EXPECT_EQ(kv_bytes_per_position(*m, DType::Q8_0, DType::Q4_0), (kTinyQwen3KvQ8_0 + kTinyQwen3KvQ4_0) / 2);
  EXPECT_EQ(state_bytes_per_token(*m, 0, 2), 0.0);
  EXPECT_EQ(flops_per_token(*m, 0), tiny_qwen3_flops(0));
  EXPECT_EQ(flops_per_token(*m, 1000), tiny_qwen3_flops(1000));
  EXPECT_EQ(flops_per_token(*m, 1000, /*with_output=*/false), tiny_qwen3_flops(1000, false));

  // tiny-qwen35: layers [DeltaNet, attention] x 2; DeltaNet 2 key heads / 4 value heads of 64, conv
  // kernel 4: a state of (4 - 1) x (2*2*64 + 4*64) conv floats + 4 x 64 x 64 matrix floats per layer,
  // read and written once a token.
  auto q = tiny("tiny-qwen35:F32");
  const double state = 2.0 * 4 * (3 * 512 + 4 * 64 * 64) * 2;  // 286720
  EXPECT_EQ(state_bytes_per_token(*q, 0, 4), state);
  EXPECT_EQ(state_bytes_per_token(*q, 0, 1), state / 2);
  EXPECT_EQ(state_bytes_per_token(*q, 1, 2), 0.0) << "layer 1 is an attention layer";
  EXPECT_EQ(kv_bytes_per_position(*q, DType::F16, DType::F16), 2 * (128 * 2 + 128 * 2)) << "2 attention layers";
  double weights = 0;
  for (const auto& t : q->file().tensors())
    if (t.name != "token_embd.weight" || !q->file().find_tensor("output.weight")) weights += (double)t.n_bytes;
  EXPECT_EQ(decode_bytes_per_token(*q, 10, DType::F16, DType::F16), weights + 4 * 256 + 10 * 1024 + state)
      << "every tensor but the embedding (tied: read as the output), one embedding row, KV, state";

  // tiny-qwen3moe (f32): 2 layers of 6 experts of 256, 2 per token: a token reads 2/6 of each stacked
  // tensor (3 x 256 x 256 x 6 x 4 bytes per layer); FLOPs count the router, 2 experts, no dense FFN.
  auto e = tiny("tiny-qwen3moe:F32");
  double all = 0;
  for (const auto& t : e->file().tensors())
    if (t.name != "token_embd.weight") all += (double)t.n_bytes;
  const double experts = 2 * 3 * 256.0 * 256 * 6 * 4;
  EXPECT_EQ(decode_bytes_per_token(*e, 0, DType::F16, DType::F16), all - experts * 4 / 6 + 256 * 4);
  const double moe_weights = 256.0 * 512 + 2 * (256.0 * (6 + 3 * 2 * 256) + 256.0 * (256 + 128 + 128) + 256.0 * 256);
  EXPECT_EQ(flops_per_token(*e, 0), 2 * (moe_weights + 2 * 4 * (64 + 64)));
}

// bench's JSON for a CPU run of tiny-qwen3:F32: tg8 reads its bytes at the mean depth 4, so
// roofline t/s = host GB/s / bytes, GB/s = t/s x bytes, % = t/s / roofline t/s; pp16's TFLOP/s uses the
// FLOPs at its mean depth 8.
TEST(BenchCliTest, RooflineArithmeticFromHandCountedBytes) {
  const auto r = test::run_cli({"bench", "-m", "synthetic:tiny-qwen3:F32", "-p", "16", "-n", "8", "-r", "2", "-t", "2", "-o", "json",
                                "-ctk", "q8_0", "-ctv", "q8_0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto rows = nlohmann::json::parse(r.out);
  ASSERT_EQ(rows.size(), 2u);
  const auto& pp = rows[0];
  const auto& tg = rows[1];
  EXPECT_EQ(pp["test"], "pp16");
  EXPECT_EQ(tg["test"], "tg8");
  EXPECT_EQ(tg["type_k"], "q8_0");
  EXPECT_EQ(tg["backends"], "CPU");
  EXPECT_EQ(pp["model_size"].get<double>(), kTinyQwen3F32Bytes - 4 * 256 + 4.0 * 512 * 256) << "every tensor, the whole embedding";
  for (const auto* row : {&pp, &tg}) {
    const auto& s = (*row)["samples_ts"];
    ASSERT_EQ(s.size(), 2u);
    EXPECT_NEAR((*row)["avg_ts"].get<double>(), (s[0].get<double>() + s[1].get<double>()) / 2, 1e-9 * s[0].get<double>());
  }
  const double bw = tg["host_read_gbps"].get<double>();
  ASSERT_GT(bw, 0.1);
  const double bytes = kTinyQwen3F32Bytes + 4 * kTinyQwen3KvQ8_0;
  const double ts = tg["avg_ts"].get<double>();
  EXPECT_NEAR(tg["roofline_ts"].get<double>(), bw * 1e9 / bytes, 1e-9 * bw * 1e9 / bytes);
  EXPECT_NEAR(tg["gbps"].get<double>(), ts * bytes / 1e9, 1e-9 * ts * bytes / 1e9);
  EXPECT_NEAR(tg["roofline_pct"].get<double>(), 100 * ts / (bw * 1e9 / bytes), 1e-9 * 100 * ts / (bw * 1e9 / bytes));
  const double pp_ts = pp["avg_ts"].get<double>();
  const double pp_flops = tiny_qwen3_flops(8, /*with_output=*/false);  // a prompt row computes no logits
  EXPECT_NEAR(pp["tflops"].get<double>(), pp_ts * pp_flops / 1e12, 1e-9 * pp_ts * pp_flops / 1e12);
  EXPECT_EQ(pp["roofline_ts"].get<double>(), 0.0) << "prefill rows carry no decode roofline";

  // A mixture of experts: the roofline counts the experts a token reads (2 of 6 here), not the file.
  const auto moe = test::run_cli({"bench", "-m", "synthetic:tiny-qwen3moe:F32", "-p", "0", "-n", "8", "-r", "1", "-t", "2", "-o", "json"});
  ASSERT_EQ(moe.exit_code, 0) << moe.err;
  const auto moe_tg = nlohmann::json::parse(moe.out)[0];
  const double moe_bw = moe_tg["host_read_gbps"].get<double>();
  const double moe_bytes = decode_bytes_per_token(*tiny("tiny-qwen3moe:F32"), 4, DType::F16, DType::F16);
  EXPECT_NEAR(moe_tg["roofline_ts"].get<double>(), moe_bw * 1e9 / moe_bytes, 1e-9 * moe_bw * 1e9 / moe_bytes);

  // The markdown table: one row per test with its t/s, and the roofline line.
  const auto md = test::run_cli({"bench", "-m", "synthetic:tiny-qwen3:F32", "-p", "0", "-n", "4", "-r", "1", "-t", "1"});
  ASSERT_EQ(md.exit_code, 0) << md.err;
  EXPECT_TRUE(std::regex_search(md.out, std::regex(R"(\| tg4 \| [0-9.]+ ± [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9]+% \|)"))) << md.out;
  EXPECT_NE(md.out.find("roofline: read bandwidth host"), std::string::npos) << md.out;
  // Bad input: one error line.
  const auto bad = test::run_cli({"bench", "-m", "synthetic:tiny-qwen3:F32", "-ctk", "q9"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("error: "), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("q9"), std::string::npos) << bad.err;
}

// `roofline run` on llama2.c's stories260K: greedy from "Zoo" prints the text llama2.c's run.c prints
// (tests/fixtures/README.md; transformers' float64 oracle gives the same 60 tokens) after the echoed
// prompt, and the speeds on stderr.
TEST(RunCliTest, StoriesGreedyTextIsLlama2cs) {
  ROOFLINE_SHARED_PATH_OR_SKIP(dir, "testdata/models/stories260K");
  const std::string gguf = test::temp_dir() + "/stories260K.gguf";
  auto c = test::run_cli({"convert", dir + "/stories260K.bin", "--tokenizer", dir + "/tok512.bin", "-o", gguf, "--no-progress"});
  ASSERT_EQ(c.exit_code, 0) << c.err;
  const auto r = test::run_cli({"run", "-m", gguf, "-p", "Zoo", "-n", "60", "--temp", "0", "-t", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string story =
      "Zoo was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball. She wanted to "
      "play with it, but she didn't want to play with it.";
  EXPECT_EQ(r.out.substr(0, story.size()), story);
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(prompt: 4 tokens in [0-9.]+ s, [0-9.]+ tok/s \| generation: 60 tokens in [0-9.]+ s, [0-9.]+ tok/s\n)")))
      << r.err;
  EXPECT_EQ(r.out.find("tok/s"), std::string::npos) << "the speed line is not part of the text";
  // Fewer tokens: a prefix of the same story; a prompt over the context: one error line.
  const auto shorter = test::run_cli({"run", "-m", gguf, "-p", "Zoo", "-n", "5", "--temp", "0", "-t", "1"});
  const std::string five = shorter.out.substr(0, shorter.out.find('\n'));
  EXPECT_GT(five.size(), 8u);
  EXPECT_EQ(five, story.substr(0, five.size()));
  const auto too_long = test::run_cli({"run", "-m", gguf, "-p", std::string(200, 'a'), "-c", "16", "-t", "1"});
  EXPECT_EQ(too_long.exit_code, 1);
  EXPECT_NE(too_long.err.find("the context only 16"), std::string::npos) << too_long.err;
}
