// The command line as llama.cpp users type it: values out of range refused in one line (--port, -np,
// sampling flags, -n), -c capped at the trained context and a context beyond the machine refused with
// the size it needs, -t capped at the cores, a repeated flag's last value winning, oversized numbers
// and unknown flags as one "error:" line with exit status 2 for every command, -ngl all named as
// such, bench's stated -ngl default, -sm row on the CPU, serve's ignored llama-server flags
// named in one warning, and convert's messages for a GGUF input and a missing output folder.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "backend/gpu.h"
#include "test_util.h"

namespace roofline::test {
namespace {

const char* kTiny = "synthetic:tiny-qwen3:Q8_0";

int lines(const std::string& s) { return (int)std::count(s.begin(), s.end(), '\n'); }

#define EXPECT_CONTAINS(haystack, needle) EXPECT_NE((haystack).find(needle), std::string::npos) << (haystack)

TEST(CliArgs, ServeRefusesBadPortsAndSlotCountsBeforeListening) {
  CommandResult r0;
  for (const char* port : {"70000", "-1", "65536"}) {
    auto r = run_cli({"serve", "-m", kTiny, "--port", port});
    EXPECT_EQ(r.exit_code, 1) << port;
    EXPECT_EQ(r.err, fmt::format("error: --port {}: expected 0..65535 (0: any free port)\n", port));
    EXPECT_EQ(r.out, "");  // never said it listens
  }
  // Past 65536 slots the counts of workers, state cells and queued streams overflowed int (UBSan).
  for (const char* np : {"0", "-3", "65537", "2147483647"}) {
    auto r = run_cli({"serve", "-m", kTiny, "--port", "0", "-np", np});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(r.err, fmt::format("error: -np {}: expected 1..65536 slots (or -1: auto, 4)\n", np));
  }
  r0 = run_cli({"serve", "-m", kTiny, "--port", "0", "--queue-size", "2147483647"});
  EXPECT_EQ(r0.exit_code, 1);
  EXPECT_EQ(r0.err, "error: --queue-size 2147483647: expected at most 1048576 waiting requests\n");
  r0 = run_cli({"serve", "-m", kTiny, "--port", "0", "--max-body-size", "1e308"});  // was a float-to-size_t overflow
  EXPECT_EQ(r0.exit_code, 1);
  EXPECT_CONTAINS(r0.err, "--max-body-size 1e+308: expected a positive size in MiB, at most 1048576");
  // -np -1 is llama-server's "auto": accepted (this start then fails on the model, not on -np).
  auto r = run_cli({"serve", "-m", "/nonexistent.gguf", "--port", "0", "-np", "-1"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_CONTAINS(r.err, "/nonexistent.gguf: cannot open");
}

// bench -b 0 stepped through the prompt 0 tokens at a time, forever; -npl 0 printed nan rows.
TEST(CliArgs, BenchRefusesStepSizesOfZero) {
  for (const char* flag : {"-b", "-ub", "-npl"}) {
    auto r = run_cli({"bench", "-m", kTiny, "-p", "4", "-n", "2", "-r", "1", flag, "0"});
    EXPECT_EQ(r.exit_code, 1) << flag;
    EXPECT_EQ(r.err, fmt::format("error: {} 0: out of range (1..16777216)\n", flag));
  }
}

TEST(CliArgs, RunCapsTheContextAtTheTrainedOne) {
  auto r = run_cli({"run", "-m", kTiny, "-p", "hi", "-n", "2", "-c", "100000"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_CONTAINS(r.err, "warning: -c 100000 is more than the model's trained context 2048; using 2048");
  EXPECT_CONTAINS(r.err, "KV cache: 2048 positions");
  r = run_cli({"run", "-m", kTiny, "-p", "hi", "-n", "2", "-c", "2147483647"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_CONTAINS(r.err, "using 2048");
}

// A model trained on a long context (16M positions, the most a GGUF may state) whose KV cache this
// machine cannot hold: refused with the size it needs, not an allocator's message.
// The process runs under `ulimit -v` of 4 GiB (what a container or a limited shell gives it), so the
// check is exercised on any machine: a 32 GiB KV cache is refused with its size, not an allocator's error.
TEST(CliArgs, AContextBeyondTheMemoryIsRefusedWithItsSize) {
  namespace fs = std::filesystem;
  // 2 layers x 2 KV heads x 64 x (K + V) x 4 bytes (f32) = 2 KiB a position; 2^24 positions = 32 GiB.
  const std::string dir = temp_dir();
  fs::copy(source_dir() + "/tests/fixtures/hf/qwen3_kq_f16", dir + "/hf", fs::copy_options::recursive);
  std::ifstream in(dir + "/hf/config.json");
  std::string config((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  const std::string key = "\"max_position_embeddings\": 4096";
  ASSERT_NE(config.find(key), std::string::npos);
  config.replace(config.find(key), key.size(), "\"max_position_embeddings\": 16777216");
  std::ofstream(dir + "/hf/config.json") << config;
  ASSERT_EQ(run_cli({"convert", dir + "/hf", "-o", dir + "/long.gguf", "--no-progress"}).exit_code, 0);
  for (const char* c : {"16777216", "2147483647"}) {  // the second is capped to the first, with a warning
    const std::string cmd = fmt::format("ulimit -v 4194304 && exec '{}' run -m '{}/long.gguf' -p hi -n 1 -c {} -ctk f32 -ctv f32 -ngl 0 "
                                        ">'{}/out' 2>'{}/err' </dev/null",
                                        binary_path(), dir, c, dir, dir);
    const int status = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 1) << c;
    std::ifstream ef(dir + "/err");
    const std::string err((std::istreambuf_iterator<char>(ef)), std::istreambuf_iterator<char>());
    EXPECT_CONTAINS(err, "error: -c 16777216 needs 32.0 GiB of KV cache (2.0 KiB per position with K f32 and V f32), more "
                         "than the 4.0 GiB of memory this process may use");
    EXPECT_CONTAINS(err, "lower -c, or use -ctk/-ctv q8_0\n");
  }
}

TEST(CliArgs, RunRefusesSamplingValuesLlamaCppGivesNoMeaning) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--top-k", "-5"}, "error: --top-k -5: expected 0 (off) or a positive count\n"},
      {{"--top-p", "2"}, "error: --top-p 2: expected 0..1 (1: off)\n"},
      {{"--min-p", "-0.5"}, "error: --min-p -0.5: expected 0..1 (0: off)\n"},
      {{"--typical", "1.5"}, "error: --typical 1.5: expected 0..1 (1: off)\n"},
      {{"--repeat-penalty", "0"}, "error: --repeat-penalty 0: expected a positive number (1: off)\n"},
      {{"-n", "-100"}, "error: -n -100: expected a count, -1 (until the end of generation) or -2 (until the context is full)\n"},
  };
  for (const auto& [flags, message] : cases) {
    std::vector<std::string> args = {"run", "-m", kTiny, "-p", "hi"};
    args.insert(args.end(), flags.begin(), flags.end());
    auto r = run_cli(args);
    EXPECT_EQ(r.exit_code, 1) << flags[0];
    EXPECT_EQ(r.err, message);
  }
  // llama.cpp's conventions are accepted: -n -1, --top-k 0, --top-p 1, a negative temperature (greedy).
  auto r = run_cli({"run", "-m", kTiny, "-p", "hi", "-n", "-1", "-c", "64", "--top-k", "0", "--top-p", "1", "--temp", "-1"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// --f16-copies (f16 copies of the GPU weights for prompts): auto, on, off or a cap in GiB, checked before the
// model loads by every command that takes it; where there is no GPU it changes nothing.
TEST(CliArgs, F16CopiesTakeAutoOnOffOrASize) {
  for (const char* bad : {"lots", "-1", "0", "1e9", ""}) {
    for (const char* cmd : {"run", "bench"}) {
      std::vector<std::string> args = {cmd, "-m", kTiny, "-p", std::string(cmd) == "run" ? "hi" : "8", "-n", "2", "--f16-copies", bad};
      auto r = run_cli(args);
      EXPECT_EQ(r.exit_code, 1) << cmd << " " << bad;
      EXPECT_EQ(r.err, fmt::format("error: --f16-copies '{}': expected auto, on, off or a size in GiB\n", bad)) << cmd;
    }
  }
  for (const char* good : {"auto", "on", "off", "12.5"}) {
    auto r = run_cli({"run", "-m", kTiny, "-p", "hi", "-n", "2", "-ngl", "0", "--f16-copies", good});
    EXPECT_EQ(r.exit_code, 0) << good << ": " << r.err;
  }
}

TEST(CliArgs, ThreadsBeyondTheCoresAreCapped) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  auto r = run_cli({"run", "-m", kTiny, "-p", "hi", "-n", "2", "-t", "1000"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_CONTAINS(r.err, fmt::format("warning: -t 1000 is more than the {} cores of this machine; using {}", cores, cores));
  // The synthetic model's builder took -t as it stood: 100000 threads, a minute and more before a token.
  const auto start = std::chrono::steady_clock::now();
  r = run_cli({"run", "-m", kTiny, "-p", "hi", "-n", "2", "-t", "100000"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

// perplexity and imatrix rounded -c 2147483647 up to whole KV blocks in int (UBSan); quantize, synth,
// convert, perplexity and imatrix started -t threads for their own pools, uncapped.
TEST(CliArgs, WindowsAndThreadsPastTheirRanges) {
  const std::string text = test::temp_dir() + "/text.txt";
  {
    std::ofstream f(text);
    for (int i = 0; i < 200; ++i) f << "hello world ";
  }
  for (const char* cmd : {"perplexity", "imatrix"}) {
    std::vector<std::string> args = {cmd, "-m", kTiny, "-f", text, "-c", "2147483647"};
    if (std::string(cmd) == "imatrix") args.insert(args.end(), {"-o", test::temp_dir() + "/im.gguf"});
    auto r = run_cli(args);
    EXPECT_EQ(r.exit_code, 1) << cmd;
    EXPECT_EQ(r.err, "error: -c 2147483647: expected windows of 1..16777216 tokens\n") << cmd;
  }
  const auto start = std::chrono::steady_clock::now();
  auto r = run_cli({"quantize", "-t", "100000", "synthetic:tiny-qwen3:F32", test::temp_dir() + "/q.gguf", "Q4_K_M"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = run_cli({"perplexity", "-m", kTiny, "-f", text, "-c", "64", "-t", "100000"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

TEST(CliArgs, ARepeatedFlagTakesItsLastValue) {
  auto greedy = run_cli({"run", "-m", kTiny, "-p", "hi", "-n", "12", "--temp", "0"});
  auto repeated = run_cli({"run", "-m", kTiny, "-p", "hi", "-n", "3", "-n", "12", "--seed", "7", "--temp", "5", "--temp", "0"});
  auto hot = run_cli({"run", "-m", kTiny, "-p", "hi", "-n", "12", "--seed", "7", "--temp", "5"});
  ASSERT_EQ(greedy.exit_code, 0) << greedy.err;
  ASSERT_EQ(repeated.exit_code, 0) << repeated.err;
  EXPECT_EQ(repeated.out, greedy.out);
  EXPECT_NE(hot.out, greedy.out);  // the first value would have sampled
  // Flags and the single-dash spellings of llama.cpp alike.
  auto ngl = run_cli({"run", "-m", kTiny, "-p", "hi", "-n", "2", "-ngl", "bogus", "-ngl", "0"});
  EXPECT_EQ(ngl.exit_code, 0) << ngl.err;
}

// One rule for every command: 2 for a command line that does not parse, with one "error:" line.
TEST(CliArgs, UsageErrorsExitTwoWithOneLineForEveryCommand) {
  for (const char* cmd : {"convert", "quantize", "run", "chat", "serve", "bench", "inspect", "tokenize", "template",
                          "perplexity", "imatrix", "synth"}) {
    auto r = run_cli({cmd, "--no-such-flag"});
    EXPECT_EQ(r.exit_code, 2) << cmd << ": " << r.err;
    EXPECT_EQ(lines(r.err), 1) << cmd << ": " << r.err;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << cmd << ": " << r.err;
    auto help = run_cli({cmd, "--help"});
    EXPECT_EQ(help.exit_code, 0) << cmd;
    EXPECT_CONTAINS(help.out, "Exit status: 0 success; 1 an error while running");
  }
  for (const char* flag : {"-c", "-n", "-b", "--top-k"}) {
    auto r = run_cli({"run", "-m", kTiny, "-p", "hi", flag, "99999999999"});
    EXPECT_EQ(r.exit_code, 2) << flag;
    EXPECT_EQ(lines(r.err), 1) << r.err;
    EXPECT_CONTAINS(r.err, "'99999999999' is not a valid value");
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  }
  auto r = run_cli({"run", "-m", kTiny, "-p", "hi", "-c", "lots"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(run_cli({"no-such-command"}).exit_code, 2);
  EXPECT_EQ(run_cli({}).exit_code, 2);
  r = run_cli({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_CONTAINS(r.out, "Exit status: 0 success");
  EXPECT_CONTAINS(r.out, "A flag given twice takes its last value.");
  // Missing arguments are usage errors too; values out of range are errors while running.
  EXPECT_EQ(run_cli({"run", "-p", "hi"}).exit_code, 2);
  EXPECT_EQ(run_cli({"tokenize", "-m", kTiny}).exit_code, 2);
  EXPECT_EQ(run_cli({"quantize", "in.gguf"}).exit_code, 2);
  EXPECT_EQ(run_cli({"synth", "tiny-qwen3:Q8_0"}).exit_code, 2);
  EXPECT_EQ(run_cli({"run", "-m", kTiny, "-p", "hi", "-ngl", "lots"}).exit_code, 2);
  EXPECT_EQ(run_cli({"run", "-m", kTiny, "-p", "hi", "-ngl", "-7"}).exit_code, 1);
}

TEST(CliArgs, NglAllIsNamedAndBenchStatesTheDefaultItUses) {
  const bool gpu = !gpu_devices().empty();
  auto r = run_cli({"run", "-m", kTiny, "-p", "hi", "-n", "2", "-ngl", "all"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("-2"), std::string::npos) << r.err;
  if (!gpu) { EXPECT_CONTAINS(r.err, "warning: -ngl all: "); }
  auto help = run_cli({"bench", "--help"});
  EXPECT_CONTAINS(help.out, "--n-gpu-layers TEXT=99");
  EXPECT_CONTAINS(help.out, "or runs on the CPU (ngl 0) where there is no GPU");
  if (!gpu) {  // the default on a machine without a GPU: the CPU, as the help says, without a warning
    auto b = run_cli({"bench", "-m", kTiny, "-p", "8", "-n", "2", "-r", "1", "--no-warmup"});
    ASSERT_EQ(b.exit_code, 0) << b.err;
    EXPECT_EQ(b.err.find("-ngl"), std::string::npos) << b.err;
    EXPECT_CONTAINS(b.out, "| CPU | 0 |");
  }
}

// -sm row splits layers over several GPUs (engine/tensor_parallel.h); with the layers on the CPU (or one
// GPU) there is nothing to split and it runs as without it. An unknown mode is one line.
TEST(CliArgs, SplitModeRowRunsWhereThereIsNothingToSplit) {
  auto r = run_cli({"run", "-m", kTiny, "-p", "hi", "-n", "4", "-sm", "row", "-ngl", "0"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = run_cli({"run", "-m", kTiny, "-p", "hi", "-sm", "rows", "-ngl", "0"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "error: -sm 'rows': expected none, layer or row\n");
  // -dev: the GPUs by name or number; none keeps every layer on the CPU; anything else is one line.
  r = run_cli({"run", "-m", kTiny, "-p", "hi", "-n", "4", "-dev", "none", "-ngl", "all"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("-ngl"), std::string::npos) << r.err;
  for (const char* bad : {"GPU0", "CUDA", "0,,1", "-1"}) {
    r = run_cli({"bench", "-m", kTiny, "-p", "8", "-n", "2", "-r", "1", "-dev", bad});
    EXPECT_EQ(r.exit_code, 1) << bad;
    EXPECT_CONTAINS(r.err, "error: --device '" + std::string(bad) + "': expected GPUs as CUDA0,CUDA1 (or 0,1), or none\n");
  }
}

TEST(CliArgs, ServeNamesTheLlamaServerFlagsItIgnores) {
  auto r = run_cli({"serve", "-m", "/nonexistent.gguf", "--port", "0", "-fa", "off", "-ub", "256", "--no-cont-batching",
                    "--no-jinja", "--no-kv-unified", "--no-webui", "-cb"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_CONTAINS(r.err, "warning: ignored (llama-server flags without effect in roofline): -fa off (attention is always the "
                         "fused kernel), -ub 256 (steps are sized by -b), --no-cont-batching (continuous batching is always "
                         "on), --no-jinja (chat templates are always Jinja), --no-kv-unified (one KV pool serves every slot)\n");
  // What roofline does anyway draws no warning.
  r = run_cli({"serve", "-m", "/nonexistent.gguf", "--port", "0", "-fa", "on", "-cb", "--jinja", "--no-webui"});
  EXPECT_EQ(r.err.find("warning: ignored"), std::string::npos) << r.err;
}

TEST(CliArgs, ConvertSaysWhatIsWrongBeforeConverting) {
  const std::string dir = temp_dir();
  ASSERT_EQ(run_cli({"synth", "tiny-qwen3:Q8_0", "-o", dir + "/m.gguf"}).exit_code, 0);
  auto r = run_cli({"convert", dir + "/m.gguf", "-o", dir + "/out.gguf"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "error: " + dir + "/m.gguf: already a GGUF file; nothing to convert (roofline quantize changes its type, "
                   "roofline inspect shows it)\n");
  r = run_cli({"convert", source_dir() + "/tests/fixtures/hf/llama_f32", "-o", "/nonexistent/dir/x.gguf"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "error: -o /nonexistent/dir/x.gguf: the folder /nonexistent/dir does not exist\n");  // nothing converted first
}

TEST(CliArgs, ServePoolingTakesLlamaServerValues) {
  auto r = run_cli({"serve", "-m", kTiny, "--port", "0", "--embeddings", "--pooling", "max"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "error: --pooling 'max': use none, mean, cls or last\n");
  EXPECT_EQ(r.out, "");
  r = run_cli({"serve", "-m", kTiny, "--port", "0", "--embeddings", "--pooling", "rank"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_CONTAINS(r.err, "--pooling rank: reranking needs a model with a classification head");
  r = run_cli({"serve", "-m", kTiny, "--port", "0", "--embeddings", "--embd-normalize", "-5"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "error: --embd-normalize -5: expected -1..64\n");
}

}  // namespace
}  // namespace roofline::test
