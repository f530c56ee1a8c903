// `roofline serve` never hangs on a bad start: each input that fails (a missing, truncated or non-GGUF
// file, an unknown synthetic shape, a broken chat template, -b 0, -c -5, a KV type the model cannot
// take) exits 1 within 5 s, 20 runs each (the listener thread once raced the stop and kept the
// process alive in accept()); SIGTERM and SIGINT while a large model loads end it within 5 s.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <fstream>
#include <mutex>

#include "cli/cli_process.h"
#include "test_util.h"

namespace roofline::test {
namespace {

// A small converted model whose heads (16 values) a q4_0 KV cache cannot hold (blocks of 32).
const std::string& llama_fixture() {
  static std::once_flag once;
  static std::string path;
  std::call_once(once, [] {
    const std::string out = temp_dir() + "/llama_f32.gguf";
    auto r = run_cli({"convert", source_dir() + "/tests/fixtures/hf/llama_f32", "-o", out, "--no-progress"});
    if (r.exit_code == 0) path = out;
  });
  return path;
}

struct BadStart {
  std::string what;
  std::vector<std::string> args;
};

std::vector<BadStart> bad_starts() {
  const std::string dir = temp_dir();
  const std::string tiny = dir + "/tiny.gguf", truncated = dir + "/truncated.gguf", junk = dir + "/junk.gguf";
  EXPECT_EQ(run_cli({"synth", "tiny-qwen3:Q8_0", "-o", tiny}).exit_code, 0);
  {
    std::ifstream in(tiny, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(truncated, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    std::ofstream(junk) << "this is not a model\n";
  }
  return {
      {"a missing file", {"-m", dir + "/nonexistent.gguf"}},
      {"a truncated GGUF", {"-m", truncated}},
      {"a non-GGUF file", {"-m", junk}},
      {"an unknown synthetic shape", {"-m", "synthetic:no-such-shape:Q4_K_M"}},
      {"a missing --chat-template-file", {"-m", tiny, "--chat-template-file", dir + "/missing.jinja"}},
      {"a broken --chat-template", {"-m", tiny, "--chat-template", "{% for m in messages %}{{ m.content "}},
      {"-b 0", {"-m", tiny, "-b", "0"}},
      {"-c -5", {"-m", tiny, "-c", "-5"}},
      {"-ctk q4_0 on heads of 16", {"-m", llama_fixture(), "-ctk", "q4_0", "-ctv", "q4_0"}},
  };
}

TEST(ServeExit, EveryBadStartExitsOneWithinFiveSeconds) {
  ASSERT_FALSE(llama_fixture().empty()) << "converting tests/fixtures/hf/llama_f32 failed";
  for (const BadStart& b : bad_starts()) {
    for (int run = 0; run < 20; ++run) {
      std::vector<std::string> args = {"serve", "--port", "0", "-t", "1"};
      args.insert(args.end(), b.args.begin(), b.args.end());
      CliProcess p(args);
      ASSERT_TRUE(p.started());
      const auto st = p.wait(5.0);
      ASSERT_TRUE(st.has_value()) << b.what << ": still running after 5 s (run " << run << ")\n" << p.err();
      ASSERT_TRUE(WIFEXITED(*st)) << b.what << ": ended by signal " << WTERMSIG(*st);
      ASSERT_EQ(WEXITSTATUS(*st), 1) << b.what << " (run " << run << "):\n" << p.err();
      if (run == 0) {  // one "error: ..." line says what is wrong
        const std::string err = p.err();
        EXPECT_NE(err.find("error: "), std::string::npos) << b.what << ": " << err;
        EXPECT_EQ(err.find("cannot load the model"), std::string::npos) << b.what << ": " << err;
      }
    }
  }
}

// The messages name what is wrong (not "cannot load the model" for a template file).
TEST(ServeExit, BadStartMessagesNameTheCause) {
  ASSERT_FALSE(llama_fixture().empty());
  const auto starts = bad_starts();
  auto err_of = [&](size_t i) {
    std::vector<std::string> args = {"serve", "--port", "0", "-t", "1"};
    args.insert(args.end(), starts[i].args.begin(), starts[i].args.end());
    CliProcess p(args);
    EXPECT_TRUE(p.wait(5.0).has_value());
    return p.err();
  };
  EXPECT_NE(err_of(0).find("nonexistent.gguf: cannot open"), std::string::npos);
  EXPECT_NE(err_of(4).find("error: --chat-template-file " + std::string()), std::string::npos);
  EXPECT_NE(err_of(4).find("missing.jinja: cannot open"), std::string::npos);
  EXPECT_NE(err_of(5).find("error: --chat-template: "), std::string::npos);
  EXPECT_NE(err_of(6).find("error: -b 0: the batch size must be at least 1"), std::string::npos);
  EXPECT_NE(err_of(7).find("error: -c -5: the context size cannot be negative"), std::string::npos);
  EXPECT_NE(err_of(8).find("KV cache type Q4_0 needs a head dimension that is a multiple of 32"), std::string::npos);
}

// A large synthetic model takes seconds to build here; a signal during that ends the process at once.
void expect_signal_ends_loading(int sig) {
  CliProcess p({"serve", "--port", "0", "-m", "synthetic:qwen3-14b:Q4_K_M", "-ngl", "0"});
  ASSERT_TRUE(p.started());
  ASSERT_TRUE(p.wait_for_line("listening on", 10.0)) << p.err();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // well inside the load
  p.signal(sig);
  const auto st = p.wait(5.0);
  ASSERT_TRUE(st.has_value()) << "still running 5 s after the signal\n" << p.err();
  EXPECT_TRUE(WIFSIGNALED(*st) && WTERMSIG(*st) == sig) << "wait status " << *st << "\n" << p.err();
  EXPECT_NE(p.err().find("while loading the model: exiting"), std::string::npos) << p.err();
}

TEST(ServeExit, SigtermWhileLoadingExitsWithinFiveSeconds) { expect_signal_ends_loading(SIGTERM); }
TEST(ServeExit, SigintWhileLoadingExitsWithinFiveSeconds) { expect_signal_ends_loading(SIGINT); }

}  // namespace
}  // namespace roofline::test
