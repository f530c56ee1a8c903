// `roofline perplexity -m MODEL -f TEXT [-c 512]`: llama-perplexity's numbers (second half of each
// window scored; "Final estimate: PPL = X +/- E"); --kl-divergence-base FILE saves the log-probabilities
// in llama.cpp's .kld format, adding --kl-divergence compares a model against such a file.
#include <cstdio>

#include "cli/command.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/perplexity.h"

namespace roofline::cli {
namespace {

// An engine sized for n_seq windows of n_ctx tokens in one step (n_batch / n_ctx, as llama.cpp).
// Windows past 2^24 tokens (the most a GGUF's context may say) are refused: rounding one up to whole
// blocks overflowed int at -c 2147483647.
std::unique_ptr<Engine> window_engine(std::shared_ptr<const Model> model, ModelArgs args, int n_ctx) {
  if (n_ctx < 1 || n_ctx > (1 << 24)) fail("-c {}: expected windows of 1..{} tokens", n_ctx, 1 << 24);
  const int n_seq = std::max(1, args.n_batch / n_ctx);
  args.n_batch = std::max(1, std::min(args.n_batch, n_seq * n_ctx));
  args.n_ctx = n_seq * ((n_ctx + 255) / 256 * 256);
  args.n_seq_max = n_seq;
  return create_engine(std::move(model), args);
}

int run(int argc, char** argv) {
  CLI::App app{"Perplexity of a model over a text, or its KL divergence from a base model's log-probabilities"};
  ModelArgs margs;
  margs.n_ctx = 512;
  margs.n_batch = 2048;
  add_model_options(app, margs);
  std::string text_file, kld_file;
  int n_chunks = -1;
  bool kl_divergence = false;
  app.add_option("-f,--file", text_file, "text to evaluate");
  app.add_option("--chunks", n_chunks, "windows to evaluate (default: all)");
  app.add_option("--kl-divergence-base", kld_file, "base log-probabilities: written here, or read with --kl-divergence");
  app.add_flag("--kl-divergence", kl_divergence, "compare against --kl-divergence-base instead of writing it");
  if (int rc = parse_args(app, argc, argv); rc >= 0) return rc;
  if (kl_divergence && kld_file.empty()) usage_fail("--kl-divergence needs --kl-divergence-base FILE (written by a run without --kl-divergence)");
  if (!kl_divergence && text_file.empty()) usage_fail("give the text to evaluate with -f FILE");

  auto model = load_model(margs);
  auto tokenizer = load_tokenizer(*model);

  if (kl_divergence) {
    KldReader base(kld_file);
    if (margs.n_ctx != base.n_ctx()) log_info("{} was computed with windows of {} tokens; using that", kld_file, base.n_ctx());
    auto engine = window_engine(model, margs, base.n_ctx());
    KlDivergenceOptions o;
    o.n_threads = cap_threads(margs.n_threads);
    o.n_chunks = n_chunks;
    std::printf("chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p\n");
    o.on_chunk = [&](int chunk, int, const KldStats& s) {
      std::printf("%s\n", s.chunk_line(chunk).c_str());
      std::fflush(stdout);
    };
    const KldStats stats = compute_kl_divergence(*engine, *tokenizer, base, o);
    std::printf("\n");
    for (const std::string& line : stats.report()) std::printf("%s\n", line.c_str());
    return 0;
  }

  const std::string text = read_file_or_fail(text_file, "-f");
  std::vector<int32_t> tokens = perplexity_tokens(*tokenizer, text);
  const int n_ctx = margs.n_ctx;
  auto engine = window_engine(model, margs, n_ctx);
  PerplexityOptions o;
  o.n_ctx = n_ctx;
  o.n_chunks = n_chunks;
  o.n_threads = cap_threads(margs.n_threads);
  o.kld_base_path = kld_file;
  log_info("{} tokens; windows of {}, scoring the last {} of each", tokens.size(), n_ctx, n_ctx - 1 - n_ctx / 2);
  o.on_chunk = [&](int chunk, int, double ppl) {
    std::printf("[%d]%.4f,", chunk, ppl);
    std::fflush(stdout);
  };
  const PerplexityResult r = compute_perplexity(*engine, *tokenizer, tokens, o);
  std::printf("\nFinal estimate: PPL = %.4f +/- %.5f\n", r.ppl, r.ppl_err);
  std::fflush(stdout);
  if (!kld_file.empty()) log_info("saved the log-probabilities of {} windows to {}", r.n_chunk, kld_file);
  log_info("{} windows, {} tokens scored in {:.2f} s", r.n_chunk, r.count, r.seconds);
  return 0;
}

int run_perplexity(int argc, char** argv) { return run_guarded(run, argc, argv); }
const CommandRegistration registration{"perplexity", "perplexity over a text, and KL divergence against a base model",
                                       run_perplexity, 70};

}  // namespace
}  // namespace roofline::cli
