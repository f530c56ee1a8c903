// `roofline synth SHAPE:MIX -o FILE.gguf`: writes a synthetic model (known shape, random weights) to disk.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>

#include "cli/command.h"
#include "cli/model_options.h"
#include "core/log.h"
#include "model/synthetic.h"

namespace roofline::cli {
namespace {

int run(int argc, char** argv) {
  CLI::App app{"Write a synthetic model: the exact tensor names, shapes and types of a known model, random weights"};
  std::string spec_text, output, tokenizer;
  uint64_t seed = 0;
  int threads = 0;
  bool list = false;
  app.add_option("spec", spec_text, "SHAPE:MIX (or synthetic:SHAPE:MIX[:SEED]), e.g. qwen3-32b:Q4_K_M");
  app.add_option("-o,--output", output, "output GGUF file");
  app.add_option("--tokenizer", tokenizer, "carry a real tokenizer: tokenizer.json or a GGUF vocabulary");
  app.add_option("--seed", seed, "random seed (default 1, or the spec's)");
  app.add_option("-t,--threads", threads, "threads (default: all cores)");
  app.add_flag("--list", list, "list the known shapes and mixes");
  if (int rc = parse_args(app, argc, argv); rc >= 0) return rc;
  if (list) {
    std::printf("shapes:\n");
    for (const ModelShape& s : model_shapes())
      std::printf("  %-18s %-9s %-34s hidden %5d, %2d layers, %2d/%d heads, ffn %5d, vocab %6d%s\n", s.name.c_str(),
                  s.arch.c_str(), s.display_name.c_str(), s.n_embd, s.n_layer, s.n_head, s.n_head_kv, s.n_ff, s.n_vocab,
                  s.tied_embeddings ? ", tied embeddings" : "");
    std::printf("mixes:\n ");
    for (const QuantMix& m : quant_mixes()) std::printf(" %s", m.name);
    std::printf("\n");
    return 0;
  }
  if (spec_text.empty() || output.empty())
    usage_fail("usage: roofline synth SHAPE:MIX -o FILE.gguf (roofline synth --list shows shapes and mixes)");
  SyntheticSpec spec = parse_synthetic_spec(spec_text);
  if (seed) spec.seed = seed;
  spec.tokenizer_path = tokenizer;
  const auto t0 = std::chrono::steady_clock::now();
  write_synthetic_model(spec, output, cap_threads(threads));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  log_info("wrote {} (synthetic {} {}, random weights) in {:.1f} s", output, spec.shape.name, spec.mix->name, s);
  return 0;
}

int run_synth(int argc, char** argv) { return run_guarded(run, argc, argv); }
const CommandRegistration registration{"synth", "write a synthetic model of a known shape (random weights)", run_synth, 80};

}  // namespace
}  // namespace roofline::cli
