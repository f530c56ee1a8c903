// `roofline imatrix -m MODEL -f TEXT -o OUT [-c 512] [--chunks N]`: an importance matrix over a
// calibration text, as llama-imatrix computes it, written in llama.cpp's GGUF imatrix format (or the
// legacy .dat with --output-format dat); --in-file merges earlier files.
#include <cstdio>

#include "cli/command.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/imatrix.h"
#include "engine/perplexity.h"

namespace roofline::cli {
namespace {

int run(int argc, char** argv) {
  CLI::App app{"Compute an importance matrix (llama.cpp's imatrix) over a calibration text"};
  ModelArgs margs;
  margs.n_ctx = 512;
  margs.n_batch = 512;
  add_model_options(app, margs, false);
  std::string text_file, out = "imatrix.gguf", format = "gguf";
  std::vector<std::string> in_files;
  int n_chunks = -1;
  bool process_output = false, no_ppl = false, parse_special = false;
  app.add_option("-f,--file", text_file, "calibration text");
  app.add_option("-o,--output-file", out, "output file")->capture_default_str();
  app.add_option("--output-format", format, "gguf or dat (llama.cpp's legacy format)")->capture_default_str();
  app.add_option("--chunks", n_chunks, "windows to process (default: the whole text)");
  app.add_option("--in-file", in_files, "imatrix files to merge in (repeatable)");
  app.add_flag("--process-output", process_output, "also collect output.weight");
  app.add_flag("--no-ppl", no_ppl, "do not compute the perplexity while collecting");
  app.add_flag("--parse-special", parse_special, "turn special-token text in the file into special tokens");
  if (int rc = parse_args(app, argc, argv); rc >= 0) return rc;
  if (format != "gguf" && format != "dat") fail("--output-format {}: use gguf or dat", format);
  const ImatrixFormat fmt_out = format == "dat" ? ImatrixFormat::Dat : ImatrixFormat::Gguf;
  const int n_ctx = margs.n_ctx;
  if (n_ctx <= 0 || n_ctx > (1 << 24)) fail("-c {}: expected windows of 1..{} tokens", n_ctx, 1 << 24);

  Imatrix imatrix(n_ctx);
  for (const std::string& f : in_files) {
    imatrix.merge(Imatrix::load(f, n_ctx));
    log_info("merged {}", f);
  }
  if (text_file.empty()) {
    if (in_files.empty()) usage_fail("give a calibration text (-f FILE) or imatrix files to merge (--in-file)");
    imatrix.save(out, fmt_out);
    log_info("wrote {} ({} entries, {} chunks)", out, imatrix.entries().size(), imatrix.chunk_count());
    return 0;
  }
  if (margs.model.empty()) usage_fail("-m MODEL is required with -f");
  const std::string text = read_file_or_fail(text_file, "-f");

  auto model = load_model(margs);
  auto tokenizer = load_tokenizer(*model);
  std::vector<int32_t> tokens = tokenizer->encode(text, true, parse_special);
  const int n_seq = std::max(1, margs.n_batch / n_ctx);
  ModelArgs eargs = margs;
  eargs.n_ctx = n_seq * ((n_ctx + 255) / 256 * 256);
  eargs.n_batch = std::max(1, std::min(margs.n_batch, n_seq * n_ctx));
  eargs.n_seq_max = n_seq;
  auto engine = create_engine(model, eargs);

  ImatrixRunOptions o;
  o.n_ctx = n_ctx;
  o.n_chunks = n_chunks;
  o.process_output = process_output;
  o.compute_ppl = !no_ppl;
  o.n_threads = cap_threads(margs.n_threads);
  o.on_chunk = [&](int chunk, int n_chunk, double ppl, double s) {
    if (chunk == 1) log_info("{} tokens, {} windows of {}; {:.2f} s per window", tokens.size(), n_chunk, n_ctx, s);
    if (ppl > 0) std::printf("[%d]%.4f,", chunk, ppl);
    std::fflush(stdout);
  };
  imatrix.add_dataset(text_file);
  const ImatrixRunResult r = collect_imatrix(*engine, *tokenizer, tokens, imatrix, o);
  std::printf("\n");
  std::fflush(stdout);
  if (!no_ppl) log_info("Final estimate: PPL = {:.4f}", r.ppl);
  imatrix.save(out, fmt_out);
  log_info("wrote {} ({} entries, {} chunks of {}) in {:.1f} s", out, imatrix.entries().size(), imatrix.chunk_count(), n_ctx, r.seconds);
  return 0;
}

int run_imatrix(int argc, char** argv) { return run_guarded(run, argc, argv); }
const CommandRegistration registration{"imatrix", "compute an importance matrix over a text (llama.cpp's imatrix formats)",
                                       run_imatrix, 25};

}  // namespace
}  // namespace roofline::cli
