// `roofline run -m MODEL -p PROMPT`: generates text in the terminal, streaming it, then one line with
// prompt and generation speed measured separately.
#include <chrono>
#include <cstdio>

#include "cli/command.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/sampler.h"

namespace roofline::cli {
namespace {

// Prints bytes as they become complete UTF-8 characters (a character may span several tokens).
class Utf8Printer {
 public:
  void add(const std::string& bytes) {
    pending_ += bytes;
    size_t end = complete_prefix();
    if (end) {
      std::fwrite(pending_.data(), 1, end, stdout);
      std::fflush(stdout);
      pending_.erase(0, end);
    }
  }
  void flush() {
    std::fwrite(pending_.data(), 1, pending_.size(), stdout);
    pending_.clear();
  }

 private:
  size_t complete_prefix() const {
    size_t i = pending_.size();
    // Walk back over at most 3 continuation bytes to the last lead byte.
    size_t back = 0;
    while (back < 4 && back < i && ((unsigned char)pending_[i - 1 - back] & 0xC0) == 0x80) ++back;
    if (back == i) return i;
    const unsigned char lead = (unsigned char)pending_[i - 1 - back];
    size_t need = lead < 0x80 ? 1 : (lead >> 5) == 6 ? 2 : (lead >> 4) == 14 ? 3 : (lead >> 3) == 30 ? 4 : 1;
    return back + 1 >= need ? i : i - 1 - back;
  }
  std::string pending_;
};

int run(int argc, char** argv) {
  CLI::App app{"Generate text from a prompt"};
  ModelArgs margs;
  add_model_options(app, margs);
  std::string prompt;
  int n_predict = 128;
  SamplingParams sp;
  bool no_bos = false;
  app.add_option("-p,--prompt", prompt, "prompt text")->required();
  app.add_option("-n,--n-predict", n_predict, "tokens to generate (-1: until end of generation or context)")->capture_default_str();
  app.add_option("--temp", sp.temperature, "temperature (0: greedy)")->capture_default_str();
  app.add_option("--top-k", sp.top_k, "top-k (0: off)")->capture_default_str();
  app.add_option("--top-p", sp.top_p, "top-p (1: off)")->capture_default_str();
  app.add_option("--min-p", sp.min_p, "min-p (0: off)")->capture_default_str();
  app.add_option("--repeat-penalty", sp.repeat_penalty, "repetition penalty (1: off)")->capture_default_str();
  app.add_option("--repeat-last-n", sp.repeat_last_n, "tokens the penalties look back at")->capture_default_str();
  app.add_option("--presence-penalty", sp.presence_penalty, "presence penalty")->capture_default_str();
  app.add_option("--frequency-penalty", sp.frequency_penalty, "frequency penalty")->capture_default_str();
  app.add_option("-s,--seed", sp.seed, "random seed (default: random)");
  app.add_flag("--no-bos", no_bos, "do not add the BOS token even if the model asks for it");
  if (int rc = parse_args(app, argc, argv); rc >= 0) return rc;

  auto model = load_model(margs);
  auto tokenizer = load_tokenizer(*model);
  auto engine = create_engine(model, margs);
  for (const std::string& line : engine->report()) log_info("{}", line);

  std::vector<int32_t> tokens = tokenizer->encode(prompt, !no_bos, true);
  if (tokens.empty()) fail("the prompt is empty after tokenization");
  const int n_ctx = engine->options().n_ctx;
  if ((int)tokens.size() >= n_ctx) fail("the prompt has {} tokens, the context only {}", tokens.size(), n_ctx);
  const int seq = engine->memory().create_sequence();
  Sampler sampler(sp, engine->n_vocab());

  const auto t0 = std::chrono::steady_clock::now();
  std::vector<float> logits = engine->eval(seq, tokens, false);
  const auto t1 = std::chrono::steady_clock::now();

  Utf8Printer printer;
  std::vector<int32_t> history = tokens;
  int generated = 0;
  const int limit = n_predict < 0 ? n_ctx - (int)tokens.size() : std::min(n_predict, n_ctx - (int)tokens.size());
  while (generated < limit) {
    const int32_t next = sampler.sample(logits.data(), history).token;
    history.push_back(next);
    ++generated;
    if (tokenizer->is_eog(next)) break;
    printer.add(tokenizer->token_to_piece(next, false));
    if (generated == limit) break;
    const int32_t one[1] = {next};
    logits = engine->eval(seq, one, false);
  }
  printer.flush();
  const auto t2 = std::chrono::steady_clock::now();
  const double prompt_s = std::chrono::duration<double>(t1 - t0).count();
  const double gen_s = std::chrono::duration<double>(t2 - t1).count();
  std::printf("\nprompt: %zu tokens in %.2f s, %.2f tok/s | generation: %d tokens in %.2f s, %.2f tok/s\n",
               tokens.size(), prompt_s, tokens.size() / prompt_s, generated, gen_s, generated > 0 ? generated / gen_s : 0.0);
  return 0;
}

int run_run(int argc, char** argv) { return run_guarded(run, argc, argv); }
const CommandRegistration registration{"run", "generate text from a prompt in the terminal", run_run, 50};

}  // namespace
}  // namespace roofline::cli
