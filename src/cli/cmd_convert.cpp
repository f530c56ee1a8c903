// `roofline convert SRC -o OUT.gguf [--outtype auto|f32|f16|bf16|q8_0] [--pre NAME] [--tokenizer FILE] [--no-mtp]`:
// a Hugging Face folder (llama, qwen2, qwen3, Qwen3.5) or a llama2.c checkpoint (with --tokenizer tok.bin) to GGUF.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>

#include "cli/command.h"
#include "cli/model_options.h"
#include "convert/convert.h"
#include "core/log.h"

namespace roofline::cli {
namespace {

int run(int argc, char** argv) {
  CLI::App app{"Convert a Hugging Face model folder (llama, qwen2, qwen3, Qwen3.5) or a llama2.c checkpoint to GGUF"};
  convert::ConvertOptions opt;
  app.add_option("source", opt.source, "Hugging Face folder (config.json, *.safetensors, tokenizer.json) or llama2.c model.bin")
      ->required();
  app.add_option("-o,--output,--outfile", opt.output, "output GGUF file")->required();
  app.add_option("--outtype", opt.outtype,
                 "type of the matrices: auto (default: f16 for f16 weights, else bf16, as llama.cpp's auto (Qwen3.5: the first bf16/f16 matrix decides, f16 when all are f32); f32 for llama2.c), "
                 "f32, f16, bf16, q8_0");
  app.add_option("--pre", opt.pre, "tokenizer.ggml.pre to write instead of the one detected (e.g. qwen2, llama-bpe)");
  app.add_option("--tokenizer", opt.tokenizer, "llama2.c: the tok.bin tokenizer (required); HF: another tokenizer.json");
  app.add_option("-t,--threads", opt.n_threads, "threads (default: all cores)");
  app.add_flag("--no-mtp,--no-nextn", opt.no_mtp, "Qwen3.5: leave out the MTP (NextN) block, as llama.cpp's --no-mtp");
  bool quiet = false;
  app.add_flag("--no-progress", quiet, "no progress line");
  if (int rc = parse_args(app, argc, argv); rc >= 0) return rc;
  opt.progress = !quiet;
  const auto t0 = std::chrono::steady_clock::now();
  opt.n_threads = cap_threads(opt.n_threads);
  const convert::ConvertResult r = convert::convert_model(opt);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const std::string& note : r.notes) log_warn("{}", note);
  if (r.f16_saturated)
    log_warn("{} values beyond the f16 range (|x| > 65504) were saturated to ±65504; consider --outtype bf16 or f32",
             r.f16_saturated);
  if (r.f16_flushed) log_info("{} tiny non-zero values fell below f16's smallest subnormal and became 0", r.f16_flushed);
  log_info("wrote {} ({} {}, {} tensors, {:.2f} M parameters, {:.1f} MiB) in {:.1f} s", opt.output, r.arch, r.outtype,
           r.n_tensors, (double)r.n_params / 1e6, (double)r.file_bytes / (1024.0 * 1024.0), s);
  return 0;
}

int run_convert(int argc, char** argv) { return run_guarded(run, argc, argv); }
const CommandRegistration registration{"convert", "convert a Hugging Face model or llama2.c checkpoint to GGUF", run_convert, 10};

}  // namespace
}  // namespace roofline::cli
