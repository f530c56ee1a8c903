// `roofline run` prints the prompt and the text on stdout and its speed line on stderr (so a
// redirect keeps only text), takes the prompt from -p, -f FILE, -f - or stdin; `roofline chat` (and
// `run -cnv`) converse through the model's template with a system prompt, stream each reply, print a
// speed line per reply on stderr, feed only the new turn to the sequence, and stop at /exit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>

#include "cli/cli_process.h"
#include "test_util.h"

namespace roofline::test {
namespace {

const char* kTiny = "synthetic:tiny-qwen3:Q8_0";

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

TEST(RunCommand, TextOnStdoutSpeedOnStderr) {
  auto r = run_cli({"run", "-m", kTiny, "-p", "Hello", "-n", "6", "--temp", "0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("Hello", 0), 0u) << r.out;  // the prompt first, as llama-cli prints it
  EXPECT_GT(r.out.size(), 6u);
  EXPECT_EQ(r.out.find("tok/s"), std::string::npos) << r.out;
  EXPECT_EQ(count(r.err, "prompt: "), 1) << r.err;
  EXPECT_EQ(count(r.err, "| generation: 6 tokens in "), 1) << r.err;
  auto quiet = run_cli({"run", "-m", kTiny, "-p", "Hello", "-n", "6", "--temp", "0", "--no-display-prompt"});
  ASSERT_EQ(quiet.exit_code, 0);
  EXPECT_EQ("Hello" + quiet.out, r.out);
}

TEST(RunCommand, PromptFromAFileOrStdin) {
  const std::string dir = temp_dir();
  std::ofstream(dir + "/prompt.txt") << "Once upon";
  auto p = run_cli({"run", "-m", kTiny, "-p", "Once upon", "-n", "5", "--temp", "0"});
  auto f = run_cli({"run", "-m", kTiny, "-f", dir + "/prompt.txt", "-n", "5", "--temp", "0"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  ASSERT_EQ(f.exit_code, 0) << f.err;
  EXPECT_EQ(f.out, p.out);
  for (const std::vector<std::string>& args : {std::vector<std::string>{"run", "-m", kTiny, "-f", "-", "-n", "5", "--temp", "0"},
                                               std::vector<std::string>{"run", "-m", kTiny, "-n", "5", "--temp", "0"}}) {
    CliProcess s(args, std::string("Once upon"));
    const auto st = s.wait(60);
    ASSERT_TRUE(st && WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << s.err();
    EXPECT_EQ(s.out(), p.out);
  }
  auto r = run_cli({"run", "-m", kTiny, "-f", dir + "/missing.txt"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "error: -f " + dir + "/missing.txt: cannot open (No such file or directory)\n");
  r = run_cli({"run", "-m", kTiny, "-p", "x", "-f", dir + "/prompt.txt"});
  EXPECT_EQ(r.exit_code, 2);
  r = run_cli({"run", "-m", kTiny, "-p", "x", "-sys", "be brief"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "error: -sys is for a conversation: roofline chat, or run -cnv\n");
}

// Two messages, then /exit (the line after it is never read): two replies, two speed lines, and the
// second turn reuses the first's tokens in the sequence.
void expect_chat(const std::vector<std::string>& command) {
  setenv("ROOFLINE_LOG", "debug", 1);
  CliProcess c(command, std::string("Hi there\nAnd then?\n/exit\nnever read\n"));
  unsetenv("ROOFLINE_LOG");
  const auto st = c.wait(60);
  ASSERT_TRUE(st && WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << c.err();
  const std::string err = c.err();
  EXPECT_EQ(count(err, "| generation: "), 2) << err;
  EXPECT_EQ(count(c.out(), "\n"), 2) << c.out();  // a reply a line (no prompt marker without a terminal)
  EXPECT_EQ(count(err, "debug: chat: prompt "), 2) << err;
  const size_t second = err.rfind("debug: chat: prompt ");
  ASSERT_NE(second, std::string::npos);
  int prompt = 0, reused = 0, fed = 0;
  ASSERT_EQ(std::sscanf(err.c_str() + second, "debug: chat: prompt %d tokens, %d already in the sequence, %d fed", &prompt,
                        &reused, &fed),
            3)
      << err;
  EXPECT_GT(reused, 10);  // the system prompt and the first message at least
  EXPECT_EQ(reused + fed, prompt);
}

TEST(ChatCommand, ConversesThroughTheTemplateAndStopsAtExit) {
  expect_chat({"chat", "-m", kTiny, "-sys", "You are terse.", "-n", "4", "--temp", "0"});
}

TEST(ChatCommand, RunCnvIsTheSameChat) { expect_chat({"run", "-m", kTiny, "-cnv", "-sys", "You are terse.", "-n", "4", "--temp", "0"}); }

TEST(ChatCommand, FirstMessageFromPromptThenEndOfInput) {
  CliProcess c({"chat", "-m", kTiny, "-p", "Hello", "-n", "3", "--temp", "0"}, std::string());
  const auto st = c.wait(60);
  ASSERT_TRUE(st && WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << c.err();
  EXPECT_EQ(count(c.err(), "| generation: 3 tokens"), 1) << c.err();
  // A broken template file is named as such.
  auto r = run_cli({"chat", "-m", kTiny, "--chat-template-file", "/nonexistent/t.jinja"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("error: --chat-template-file /nonexistent/t.jinja: cannot open"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace roofline::test
