// `roofline tokenize` and `roofline template` as scripts call them: output formats, flags, files,
// GGUF vocabularies, and clear errors with exit code 1.
#include <gtest/gtest.h>

#include <fstream>

#include "tokenizer/tokenizer_test_util.h"

namespace roofline {
namespace {

using test::run_cli;

TEST(TokenizeCommand, IdsAndPieces) {
  if (test::shared_dir().empty()) GTEST_SKIP() << "../shared is absent";
  const std::string qwen = test::tokenizer_path("qwen3");
  auto r = run_cli({"tokenize", "-m", qwen, "-p", "Hello world<|im_end|>", "--ids"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "9707 1879 151645\n");
  r = run_cli({"tokenize", "-m", qwen, "-p", "Hello world"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "  9707 -> 'Hello'\n  1879 -> ' world'\n");
  r = run_cli({"tokenize", "-m", qwen, "-p", "<|im_end|>", "--ids", "--no-parse-special"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("151645"), std::string::npos) << r.out;

  const std::string llama = test::tokenizer_path("llama3_1");
  r = run_cli({"tokenize", "-m", llama, "-p", "Hi", "--ids", "--add-special"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "128000 13347\n");
  r = run_cli({"tokenize", "-m", llama, "-p", "Hi", "--ids"});
  EXPECT_EQ(r.out, "13347\n");
}

TEST(TokenizeCommand, FileInputAndGgufVocab) {
  if (test::shared_dir().empty()) GTEST_SKIP() << "../shared is absent";
  const std::string path = test::temp_dir() + "/text.txt";
  std::ofstream(path) << "Hello world";
  auto r = run_cli({"tokenize", "-m", test::tokenizer_path("gpt-2"), "-f", path, "--ids"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "15496 995\n");
  r = run_cli({"tokenize", "-m", test::tokenizer_path("llama-spm"), "-p", "Hello world", "--ids", "--add-special"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "1 15043 3186\n");
  r = run_cli({"tokenize", "-m", test::tokenizer_path("tok512"), "-p", "Once upon a time", "--ids"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "403 407 261 378\n");
}

TEST(TokenizeCommand, Errors) {
  auto r = run_cli({"tokenize", "-m", "/nonexistent/tokenizer.json", "-p", "x"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("cannot open"), std::string::npos) << r.err;
  r = run_cli({"tokenize", "-m", "/nonexistent/tokenizer.json"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("-p TEXT or -f FILE"), std::string::npos) << r.err;
}

TEST(TemplateCommand, RendersLikeTheGolden) {
  ROOFLINE_SHARED_PATH_OR_SKIP(td, "testdata/tokenizer");
  const std::string dir = test::temp_dir();
  std::ofstream(dir + "/messages.json") << R"([{"role": "user", "content": "Hello!"}])";
  auto r = run_cli({"template", "-m", td + "/qwen3/tokenizer_config.json", "--messages", dir + "/messages.json",
                    "--add-generation-prompt", "--kwargs", R"({"enable_thinking":false})"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");

  // Tools and a tool call whose arguments are a JSON string.
  std::ofstream(dir + "/tools.json") << R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])";
  std::ofstream(dir + "/calls.json")
      << R"([{"role": "user", "content": "call f"}, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]}, {"role": "tool", "content": "done"}])";
  r = run_cli({"template", "-m", td + "/qwen3/tokenizer_config.json", "--messages", dir + "/calls.json", "--tools",
               dir + "/tools.json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}\n</tools>"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("<tool_response>\ndone\n</tool_response>"), std::string::npos) << r.out;

  // Llama 3.1's official template from a file, with its default date.
  r = run_cli({"template", "-m", td + "/llama3_1/tokenizer_config.json", "--messages", dir + "/messages.json",
               "--chat-template-file", td + "/chat_templates/meta-llama-Llama-3.1-8B-Instruct.jinja"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
            "Today Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>");
}

TEST(TemplateCommand, GgufTemplateAndErrors) {
  if (test::shared_dir().empty()) GTEST_SKIP() << "../shared is absent";
  const std::string dir = test::temp_dir();
  std::ofstream(dir + "/messages.json") << R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}])";
  auto r = run_cli({"template", "-m", test::tokenizer_path("phi-3"), "--messages", dir + "/messages.json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "<s><|user|>\nHi<|end|>\n<|assistant|>\nYo<|end|>\n");
  std::ofstream(dir + "/bad.jinja") << "{% for m in messages %}\n{{ m.content | nosuchfilter }}{% endfor %}";
  r = run_cli({"template", "-m", test::tokenizer_path("phi-3"), "--messages", dir + "/messages.json", "--chat-template-file",
               dir + "/bad.jinja"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("template line 2: unknown filter 'nosuchfilter'"), std::string::npos) << r.err;
  std::ofstream(dir + "/notjson.json") << "[{";
  r = run_cli({"template", "-m", test::tokenizer_path("phi-3"), "--messages", dir + "/notjson.json"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("not valid JSON"), std::string::npos) << r.err;
  r = run_cli({"template", "-m", test::tokenizer_path("gpt-2"), "--messages", dir + "/messages.json"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("has no chat template"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace roofline
