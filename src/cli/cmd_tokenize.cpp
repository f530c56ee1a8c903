// `roofline tokenize -m MODEL.gguf|VOCAB.gguf|tokenizer.json|tok.bin (-p TEXT | -f FILE) [--ids]
// [--no-parse-special] [--add-special]`: the token ids of a text ("id -> 'piece'" lines, or with --ids
// one line of space-separated ids). Special-token text is parsed by default; nothing is added.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/command.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "model/model_file.h"
#include "tokenizer/tokenizer.h"

namespace roofline::cli {
namespace {

bool has_suffix(const std::string& s, const char* suffix) {
  const std::string x(suffix);
  return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
}

int run(int argc, char** argv) {
  CLI::App app{"Print the token ids of a text"};
  std::string model, prompt, file;
  bool ids = false, no_parse_special = false, add_special = false;
  app.add_option("-m,--model", model, "GGUF model or vocabulary, tokenizer.json, llama2.c tokenizer .bin, or synthetic:SHAPE:MIX")
      ->required();
  auto* p = app.add_option("-p,--prompt", prompt, "text to tokenize");
  auto* f = app.add_option("-f,--file", file, "file whose contents to tokenize");
  p->excludes(f);
  app.add_flag("--ids", ids, "print only the ids, space-separated");
  app.add_flag("--no-parse-special", no_parse_special, "treat special-token text as plain text");
  app.add_flag("--add-special", add_special, "add BOS/EOS as the vocabulary says");
  if (int rc = parse_args(app, argc, argv); rc >= 0) return rc;
  if (p->count() == 0 && f->count() == 0) usage_fail("give the text with -p TEXT or -f FILE");
  if (f->count()) {
    std::ifstream in(file, std::ios::binary);
    if (!in) fail("{}: cannot open", file);
    std::stringstream ss;
    ss << in.rdbuf();
    prompt = ss.str();
  }

  std::shared_ptr<const Tokenizer> tok;
  if (has_suffix(model, ".json") || has_suffix(model, ".bin")) {
    tok = Tokenizer::from_file(model);
  } else {
    auto mf = open_model_file(model);
    tok = Tokenizer::from_metadata(mf->metadata());
  }
  const std::vector<int32_t> out = tok->encode(prompt, add_special, !no_parse_special);
  std::string text;
  if (ids) {
    for (size_t i = 0; i < out.size(); ++i) {
      if (i) text += ' ';
      text += std::to_string(out[i]);
    }
    text += '\n';
  } else {
    for (int32_t id : out) text += fmt::format("{:6d} -> '{}'\n", id, tok->token_to_piece(id, true));
  }
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

int run_tokenize(int argc, char** argv) { return run_guarded(run, argc, argv); }
const CommandRegistration registration{"tokenize", "print the token ids of a text", run_tokenize, 60};

}  // namespace
}  // namespace roofline::cli
