// `roofline quantize IN.gguf [OUT.gguf] TYPE [NTHREADS]`: llama-quantize's command line and output
// (K-quant mixes, --imatrix, --pure, type overrides), streamed tensor by tensor through a temporary
// file, with a progress line (tensor, types, ETA) on a terminal; Ctrl-C leaves no output behind.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>

#include "cli/command.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "engine/imatrix.h"
#include "model/model_file.h"
#include "model/quantize.h"

namespace roofline::cli {
namespace {

std::atomic<bool> g_interrupted{false};  // set by SIGINT/SIGTERM; the quantizer stops at the next rows
extern "C" void on_interrupt(int) { g_interrupted.store(true); }

std::string mix_names() {
  std::string s;
  for (const QuantMix& m : quant_mixes()) s += (s.empty() ? "" : ", ") + std::string(m.name);
  return s;
}

const QuantMix* parse_mix(const std::string& name) {
  if (const QuantMix* m = find_mix(name)) return m;
  char* end = nullptr;
  const long id = std::strtol(name.c_str(), &end, 10);
  if (!name.empty() && *end == 0)
    if (const QuantMix* m = find_mix((FileType)id)) return m;
  return nullptr;
}

DType parse_tensor_type(const std::string& name, const char* flag) {
  auto t = dtype_from_name(name);
  if (!t || !dtype_has_reference(*t)) fail("{} {}: not a tensor type roofline can write (e.g. q8_0, q6_K, q4_K, f16)", flag, name);
  return *t;
}

std::string duration(double s) {
  if (s < 60) return fmt::format("{:.0f}s", s);
  if (s < 3600) return fmt::format("{}m{:02d}s", (int)s / 60, (int)s % 60);
  return fmt::format("{}h{:02d}m", (int)s / 3600, ((int)s % 3600) / 60);
}

std::string mib(uint64_t bytes) { return fmt::format("{:.2f} MiB", bytes / 1048576.0); }

int run(int argc, char** argv) {
  CLI::App app{"Quantize a GGUF model with llama.cpp's mixes (usage: roofline quantize IN.gguf [OUT.gguf] TYPE [NTHREADS])"};
  std::vector<std::string> positional;
  std::string imatrix_path, output_type, embd_type;
  int threads = 0;
  bool pure = false, allow_requantize = false, leave_output = false, dry_run = false;
  app.add_option("args", positional, "IN.gguf [OUT.gguf] TYPE [NTHREADS]; TYPE one of: " + mix_names())->required();
  app.add_option("--imatrix", imatrix_path, "importance matrix (llama.cpp GGUF or legacy .dat)");
  app.add_flag("--pure", pure, "no mix rules: every quantizable tensor gets the type's default");
  app.add_option("--output-tensor-type", output_type, "type for output.weight (e.g. q8_0)");
  app.add_option("--token-embedding-type", embd_type, "type for token_embd.weight");
  app.add_flag("--allow-requantize", allow_requantize, "accept an already-quantized input (loses quality)");
  app.add_flag("--leave-output-tensor", leave_output, "keep output.weight in its input type");
  app.add_flag("--dry-run", dry_run, "print the plan and the output size, write nothing");
  app.add_option("-t,--threads", threads, "threads (default: all cores)");
  if (int rc = parse_args(app, argc, argv); rc >= 0) return rc;

  // IN [OUT] TYPE [NTHREADS], as llama-quantize reads them: when the second word is a type, OUT is
  // left out (IN's folder/ggml-model-TYPE.gguf).
  std::string in_path = positional[0], out_path, type_name;
  size_t next = 1;
  if (positional.size() < 2) usage_fail("usage: roofline quantize IN.gguf [OUT.gguf] TYPE [NTHREADS]");
  if (parse_mix(positional[1])) {
    type_name = positional[next++];
  } else {
    out_path = positional[next++];
    if (next >= positional.size()) usage_fail("no quantization type given (one of: {})", mix_names());
    type_name = positional[next++];
  }
  if (next < positional.size()) {
    char* end = nullptr;
    const long n = std::strtol(positional[next].c_str(), &end, 10);
    if (*end || n <= 0 || n > 4096) fail("bad thread count '{}'", positional[next]);
    threads = (int)n;
    ++next;
  }
  if (next < positional.size()) usage_fail("unexpected argument '{}' (usage: roofline quantize IN.gguf [OUT.gguf] TYPE [NTHREADS])", positional[next]);
  const QuantMix* mix = parse_mix(type_name);
  if (!mix) fail("unknown quantization type '{}' (one of: {})", type_name, mix_names());
  if (out_path.empty()) {
    const std::filesystem::path dir = std::filesystem::path(in_path).parent_path();
    out_path = (dir / ("ggml-model-" + std::string(mix->name) + ".gguf")).string();
  }

  QuantizeOptions o;
  o.mix = mix;
  o.mix_options.pure = pure;
  if (!output_type.empty()) o.mix_options.output_type = parse_tensor_type(output_type, "--output-tensor-type");
  if (!embd_type.empty()) o.mix_options.token_embedding_type = parse_tensor_type(embd_type, "--token-embedding-type");
  o.n_threads = threads > 0 ? cap_threads(threads) : ThreadPool::default_thread_count();
  o.allow_requantize = allow_requantize;
  o.leave_output_tensor = leave_output;
  ImportanceData importance;
  if (!imatrix_path.empty()) {
    importance = Imatrix::load(imatrix_path).importance(imatrix_path);
    o.imatrix = &importance;
    log_info("loaded {} importance matrix entries from {} computed on {} chunks", importance.values.size(), imatrix_path,
             importance.chunk_count);
  }

  auto in = open_model_file(in_path);
  if (dry_run) {
    const QuantizePlan plan = plan_quantization(*in, o);
    for (size_t i = 0; i < plan.tensors.size(); ++i) {
      const TensorPlan& p = plan.tensors[i];
      std::printf("[%4zu/%4zu] %-40s %-22s %6s -> %-6s %s\n", i + 1, plan.tensors.size(), p.name.c_str(),
                  gguf::TensorInfo{p.name, p.from, p.n_dims, p.ne}.shape_string().c_str(), dtype_name(p.from).c_str(),
                  dtype_name(p.to).c_str(), mib(p.out_bytes).c_str());
    }
    std::printf("%s: %s -> %s (%s)\n", mix->name, mib(plan.in_bytes).c_str(), mib(plan.out_bytes).c_str(),
                plan.n_fallback ? fmt::format("{} tensors fell back to another type", plan.n_fallback).c_str() : "no fallbacks");
    return 0;
  }

  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  struct sigaction old_int {}, old_term {};
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  o.cancel = &g_interrupted;

  const bool tty = isatty(fileno(stderr));
  auto last_draw = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  o.progress = [&](const QuantizeProgress& p) {
    if (tty) {
      const auto now = std::chrono::steady_clock::now();
      if (!p.tensor_done && now - last_draw < std::chrono::milliseconds(100)) return;
      last_draw = now;
      const double eta = p.total_fraction > 0.001 ? p.elapsed_s * (1 - p.total_fraction) / p.total_fraction : 0;
      std::fprintf(stderr, "\r\033[K[%4zu/%4zu] %-36s %5s -> %-6s %3.0f%% | %3.0f%% total, %s elapsed, ETA %s",
                   p.tensor_index + 1, p.n_tensors, p.name->c_str(), dtype_name(p.from).c_str(), dtype_name(p.to).c_str(),
                   100 * p.tensor_fraction, 100 * p.total_fraction, duration(p.elapsed_s).c_str(),
                   p.total_fraction > 0.001 ? duration(eta).c_str() : "?");
      std::fflush(stderr);
    } else if (p.tensor_done) {
      log_info("[{:4}/{:4}] {:<40} {:>6} -> {}", p.tensor_index + 1, p.n_tensors, *p.name, dtype_name(p.from), dtype_name(p.to));
    }
  };

  QuantizeResult result;
  try {
    result = quantize_model(*in, out_path, o);
  } catch (...) {
    if (tty) std::fprintf(stderr, "\n");
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
    throw;
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  if (tty) std::fprintf(stderr, "\n");
  const QuantizePlan& plan = result.plan;
  if (!plan.missing_imatrix.empty())
    log_warn("the importance matrix has no entry for {} quantized tensors (quantized without it), e.g. {}",
             plan.missing_imatrix.size(), plan.missing_imatrix.front());
  if (plan.n_fallback)
    log_warn("{} of {} tensors needed a fallback type (rows not a multiple of the block size)", plan.n_fallback, plan.tensors.size());
  log_info("{}: {} -> {} ({}) in {:.2f} s, {:.1f} s per GB of input, {} threads", out_path, mib(plan.in_bytes),
           mib(plan.out_bytes), mix->name, result.seconds, plan.in_bytes ? result.seconds / (plan.in_bytes / 1e9) : 0.0, o.n_threads);
  return 0;
}

int run_quantize(int argc, char** argv) { return run_guarded(run, argc, argv); }
const CommandRegistration registration{"quantize", "quantize a GGUF model (llama.cpp's K-quant mixes, importance matrices)",
                                       run_quantize, 20};

}  // namespace
}  // namespace roofline::cli
