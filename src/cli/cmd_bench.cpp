// `roofline bench`: prefill (pp) and decode (tg) speed measured separately, as llama-bench does, plus
// the achieved read rate (GB/s) and the fraction of the roofline: the decode bound is the time to read
// every weight once (at the measured bandwidth of the device holding it), one embedding row and the KV
// cache at that depth. `-npl` runs that many sequences in parallel, like llama-batched-bench.
// With --prompt-file (or a draft model, -md) the tg tests decode greedily after a text prompt instead of
// feeding random tokens, and with -md through speculative decoding, printing the draft's acceptance.
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "backend/gpu.h"
#include "cli/command.h"
#include "cli/draft_options.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "engine/roofline_model.h"
#include "engine/speculative.h"
#include "roofline_version.h"

namespace roofline::cli {
namespace {

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(item);
  return out;
}

// least: the smallest value the flag takes (1 for sizes a loop steps by: a batch of 0 never ended).
std::vector<int> parse_int_list(const std::string& s, const char* what, int least = 0) {
  std::vector<int> out;
  for (const std::string& item : split_list(s)) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end) usage_fail("{} '{}': expected a comma-separated list of numbers", what, s);
    if (v < least || v > (1 << 24)) fail("{} {}: out of range ({}..{})", what, item, least, 1 << 24);
    out.push_back((int)v);
  }
  if (out.empty()) usage_fail("{} needs at least one value", what);
  return out;
}

struct Config {
  std::string ctk, ctv, ngl;
  int n_batch, n_threads;
};

struct TestResult {
  std::string model_desc, model_file, backend, test;
  Config cfg;
  uint64_t model_size = 0, n_params = 0;
  int n_prompt = 0, n_gen = 0, n_depth = 0, n_parallel = 1, gpu_units = 0;
  std::vector<double> samples_ts;
  double avg_ts = 0, stddev_ts = 0, gbps = 0, roofline_pct = 0, roofline_ts = 0, tflops = 0;
  struct Device {
    std::string name;
    double bytes_per_step = 0, gbps = 0;
  };
  std::vector<Device> devices;  // decode tests: each backend's share of the bytes read
  bool speculative = false;     // tg with a draft model: several tokens per target step
  DraftStats draft;             // its drafts over the timed runs
};

// The text the tg tests decode after with -md and no --prompt-file (the drafts need real text).
constexpr const char* kDefaultBenchPrompt =
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined a screw "
    "press, movable metal type and oil-based ink into a system that could produce books quickly and cheaply. Within "
    "fifty years, presses were running in more than two hundred cities across Europe, and the number of books in "
    "circulation grew from thousands to millions. Explain, step by step, how this invention changed";

std::string human_size(uint64_t bytes) {
  const double gib = bytes / 1073741824.0;
  return gib >= 1 ? fmt::format("{:.2f} GiB", gib) : fmt::format("{:.2f} MiB", bytes / 1048576.0);
}
std::string human_params(uint64_t n) { return n >= 1000000000ull ? fmt::format("{:.2f} B", n / 1e9) : fmt::format("{:.2f} M", n / 1e6); }

// Bytes a decode token reads from each backend's memory (weights of its layers, KV to `depth`, the
// recurrent state read and written, the embedding row where it holds the embedding), in layer order.
std::vector<double> bytes_per_backend(const Model& m, const std::vector<Engine::PlacedRange>& placed, double depth, DType tk,
                                      DType tv) {
  const HParams& hp = m.hparams();
  const int n_attn = std::max(1, hp.count_layers(MixerKind::Attention));
  const double kv_per_position = kv_bytes_per_position(m, tk, tv) / n_attn;  // one layer's
  std::vector<double> bytes;
  for (const Engine::PlacedRange& p : placed) {
    double b = state_bytes_per_token(m, p.layers.begin, p.layers.end);
    for (int il = p.layers.begin; il < p.layers.end; ++il) b += layer_decode_bytes(m, il) + kv_per_position * kv_positions_read(hp, il, depth);
    if (p.layers.output) b += (double)m.output_bytes();
    if (p.layers.embedding) b += (double)dtype_row_bytes(m.token_embd().type(), hp.n_embd);
    bytes.push_back(b);
  }
  return bytes;
}

int run(int argc, char** argv) {
  CLI::App app{"Benchmark prefill and decode speed, with GB/s and % of the memory-bandwidth roofline"};
  std::vector<std::string> models;
  std::string prompts = "512", gens = "128", depths = "0", threads_list, ctk = "f16", ctv = "f16", ngl = "99";
  std::string batch_list = "512", ubatch_list, npl_list, fa = "1", output = "md", tokenizer, pg;
  int reps = 5;
  bool no_warmup = false;
  app.add_option("-m,--model", models, "model files or synthetic:SHAPE:MIX (repeatable)")->required();
  app.add_option("--tokenizer", tokenizer, "tokenizer for synthetic models (not needed for speed)");
  app.add_option("-p,--n-prompt", prompts, "prompt sizes (comma-separated)")->capture_default_str();
  app.add_option("-n,--n-gen", gens, "generated token counts (comma-separated)")->capture_default_str();
  app.add_option("--prompt-gen", pg, "pp,tg: a prompt then generation, timed together (-pg)");
  app.add_option("-d,--n-depth", depths, "KV depths prefilled before each test")->capture_default_str();
  app.add_option("-t,--threads", threads_list, "CPU thread counts (default: all cores)");
  app.add_option("-b,--batch-size", batch_list, "batch sizes (most tokens per step)")->capture_default_str();
  app.add_option("--ubatch-size", ubatch_list, "micro-batch sizes (-ub; a step is min(b, ub) tokens)");
  app.add_option("--cache-type-k", ctk, "K cache types (-ctk)")->capture_default_str();
  app.add_option("--cache-type-v", ctv, "V cache types (-ctv)")->capture_default_str();
  auto* ngl_opt = app.add_option("--n-gpu-layers", ngl,
                                 "units on the GPU (-ngl): numbers, auto or all; the default 99 offloads every unit (as "
                                 "llama-bench's), or runs on the CPU (ngl 0) where there is no GPU")
                      ->capture_default_str();
  std::string split_mode = "layer", tensor_split, vram_limit;
  app.add_option("--split-mode", split_mode, "several GPUs: none, layer or row (-sm)")->capture_default_str();
  app.add_option("--tensor-split", tensor_split, "share of the offloaded layers (-sm layer) or of each layer's heads and FFN (-sm row) per GPU, e.g. 1,1 (-ts)");
  app.add_option("--vram-limit", vram_limit, "use at most this many GiB on each GPU (one value, or one per GPU)");
  int main_gpu = 0;
  std::string device;
  add_device_option(app, device);
  app.add_option("--main-gpu", main_gpu, "GPU to use with -sm none (-mg)")->capture_default_str();
  ModelArgs placement_args;  // --cpu-moe, --n-cpu-moe, -ot (MoE experts in host memory), --f16-copies
  add_moe_placement_options(app, placement_args);
  add_f16_copies_option(app, placement_args);
  app.add_option("--flash-attn", fa, "flash attention (-fa): roofline's attention is always the fused kernel")->capture_default_str();
  app.add_option("--n-parallel", npl_list, "parallel sequences (-npl): each prefilled with -p tokens, generating -n");
  app.add_option("-r,--repetitions", reps, "repetitions per test")->capture_default_str();
  app.add_option("-o,--output", output, "output format: md, json, csv")->capture_default_str();
  app.add_flag("--no-warmup", no_warmup, "skip the warmup run");
  std::string prompt_file;
  app.add_option("--prompt-file", prompt_file,
                 "tg tests decode greedily after this text (tokenized by the model's vocabulary; --tokenizer for "
                 "synthetic models) instead of feeding random tokens; -d is then not used for them");
  DraftArgs dargs;  // -md: tg through speculative decoding
  add_draft_options(app, dargs);
  bool profile = false;
  app.add_flag("--profile", profile, "print the time of every op of the steps, per step size (GPU: CUDA graphs off while profiling; CPU: wall time per op, thread-pool waits included)");
  if (int rc = parse_args(app, argc, argv); rc >= 0) return rc;
  if (output != "md" && output != "json" && output != "csv") fail("unknown output format '{}' (md, json, csv)", output);
  if (reps < 1) fail("repetitions must be at least 1");
  if (dargs.given()) check_draft_args(dargs);
  double f16_copies_cap = 0;
  (void)parse_f16_copies(placement_args.f16_copies, f16_copies_cap);  // checked before anything is measured or loaded
  const bool text_tg = dargs.given() || !prompt_file.empty();
  std::string prompt_text = kDefaultBenchPrompt;
  if (!prompt_file.empty()) {
    std::ifstream f(prompt_file, std::ios::binary);
    if (!f) fail("--prompt-file {}: cannot open", prompt_file);
    std::stringstream ss;
    ss << f.rdbuf();
    prompt_text = ss.str();
    if (prompt_text.empty()) fail("--prompt-file {}: the file is empty", prompt_file);
  }
  for (const std::string& f : split_list(fa))
    if (f != "1" && f != "0" && f != "on" && f != "off" && f != "auto") fail("-fa '{}': expected on, off, auto, 1 or 0", f);

  const auto p_list = parse_int_list(prompts, "-p"), n_list = parse_int_list(gens, "-n"), d_list = parse_int_list(depths, "-d");
  const auto b_list = parse_int_list(batch_list, "-b", 1);
  const auto ub_list = ubatch_list.empty() ? std::vector<int>{0} : parse_int_list(ubatch_list, "-ub", 1);
  const auto npl = npl_list.empty() ? std::vector<int>{} : parse_int_list(npl_list, "-npl", 1);
  std::vector<std::pair<int, int>> pg_tests;
  if (!pg.empty()) {
    const auto v = parse_int_list(pg, "-pg");
    if (v.size() != 2) usage_fail("-pg expects pp,tg");
    pg_tests.push_back({v[0], v[1]});
  }
  const std::vector<int> t_list = threads_list.empty() ? std::vector<int>{ThreadPool::default_thread_count()} : parse_int_list(threads_list, "-t");
  // Without a GPU the default means the CPU (no warning); an -ngl given on such a machine is warned about.
  if (ngl_opt->count() == 0 && gpu_devices().empty()) ngl = "0";
  const auto ngl_list = split_list(ngl);

  const bool use_gpu = !gpu_devices().empty() && std::any_of(ngl_list.begin(), ngl_list.end(), [](const std::string& s) { return s != "0"; });
  const int max_threads = *std::max_element(t_list.begin(), t_list.end());
  const double host_bw = measure_host_read_bandwidth(max_threads);
  double gpu_bw = 0;
  std::string gpu_name;
  if (use_gpu) {
    gpu_bw = measure_gpu_read_bandwidth(0);
    gpu_name = gpu_devices()[0].name;
  }
  if (profile) {
    setenv("ROOFLINE_PROFILE", "1", 1);
    setenv("ROOFLINE_PROFILE_BW", fmt::format("{:.0f}", gpu_bw).c_str(), 1);
    setenv("ROOFLINE_PROFILE_HOST_BW", fmt::format("{:.1f}", host_bw).c_str(), 1);
  }
  log_info("read bandwidth: host {:.1f} GB/s ({} threads){}", host_bw, max_threads,
           use_gpu ? fmt::format(", GPU {:.0f} GB/s ({})", gpu_bw, gpu_name) : "");

  std::vector<TestResult> results;
  std::mt19937 rng(42);
  for (const std::string& mpath : models) {
    ModelArgs margs;
    margs.model = mpath;
    margs.tokenizer = tokenizer;
    auto model = load_model(margs);
    const HParams& hp = model->hparams();
    uint64_t model_size = 0;
    for (const auto& t : model->file().tensors()) model_size += t.n_bytes;
    std::vector<int32_t> prompt_tokens;
    if (text_tg) {
      prompt_tokens = load_tokenizer(*model)->encode(prompt_text, true, true);
      if (prompt_tokens.empty()) fail("the bench prompt is empty after tokenization");
    }
    for (const std::string& g : ngl_list)
      for (const std::string& tk : split_list(ctk))
        for (const std::string& tv : split_list(ctv))
          for (int nb : b_list)
            for (int ub : ub_list)
              for (int nt : t_list) {
                int max_ctx = 1;
                for (int d : d_list) {
                  for (int p : p_list) max_ctx = std::max(max_ctx, d + p);
                  for (int n : n_list) max_ctx = std::max(max_ctx, d + n);
                  for (auto [pp, tg] : pg_tests) max_ctx = std::max(max_ctx, d + pp + tg);
                }
                for (int np : npl)
                  for (int p : p_list)
                    for (int n : n_list) max_ctx = std::max(max_ctx, np * ((p + n + 31) / 32 * 32) + 64);  // whole KV blocks per sequence
                if (text_tg)  // the prompt, a warm-up round, the timed tokens and a last round's drafts
                  for (int n : n_list) max_ctx = std::max(max_ctx, (int)prompt_tokens.size() + n + 2 * dargs.params.n_max + 8);
                Config cfg{tk, tv, g, ub > 0 ? std::min(nb, ub) : nb, nt};
                margs.n_ctx = max_ctx;
                margs.n_threads = nt;
                margs.n_batch = std::max(cfg.n_batch, npl.empty() ? 1 : *std::max_element(npl.begin(), npl.end()));
                margs.cache_type_k = tk;
                margs.cache_type_v = tv;
                margs.n_gpu_layers = g == "99" ? "all" : g;
                margs.split_mode = split_mode;
                margs.tensor_split = tensor_split;
                margs.vram_limit = vram_limit;
                margs.main_gpu = main_gpu;
                margs.device = device;
                margs.cpu_moe = placement_args.cpu_moe;
                margs.n_cpu_moe = placement_args.n_cpu_moe;
                margs.override_tensor = placement_args.override_tensor;
                margs.f16_copies = placement_args.f16_copies;
                margs.n_seq_max = npl.empty() ? 1 : *std::max_element(npl.begin(), npl.end());
                margs.draft_rollback = dargs.given();
                margs.defer_f16_copies = dargs.given();  // the draft's engine first
                auto engine = create_engine(model, margs);
                for (const std::string& line : engine->report()) log_info("{}", line);
                std::unique_ptr<Drafter> draft;
                if (dargs.given()) draft = load_draft(dargs, margs, *engine);
                for (const std::string& line : engine->keep_f16_copies()) log_info("{}", line);
                const int units = engine->gpu_units();
                // Steps that capture CUDA graphs as their depth grows, every layer on a GPU: their warm-up is the measured
                // run itself (below); elsewhere a capture is small beside a step's CPU time.
                const bool graph_warm_up = units == hp.n_layer + 1 && !engine->decode_graph_depths().empty();
                const auto placed = engine->placements();
                int n_gpu_ranges = 0;
                for (const auto& pr : placed) n_gpu_ranges += pr.gpu ? 1 : 0;
                const std::string gpus = n_gpu_ranges > 1 ? fmt::format("CUDA x{}", n_gpu_ranges) : "CUDA";
                const std::string backend = units > 0 ? (units == hp.n_layer + 1 ? gpus : gpus + "+CPU") : "CPU";
                auto random_tokens = [&](int n) {
                  std::vector<int32_t> t((size_t)n);
                  for (auto& x : t) x = (int32_t)(rng() % (uint32_t)hp.n_vocab);
                  return t;
                };
                auto feed = [&](int seq, const std::vector<int32_t>& tokens) {
                  for (size_t s = 0; s < tokens.size(); s += (size_t)cfg.n_batch) {
                    std::vector<Engine::BatchRow> rows;
                    for (size_t i = s; i < std::min(tokens.size(), s + (size_t)cfg.n_batch); ++i)
                      rows.push_back({seq, tokens[i], i + 1 == tokens.size()});
                    engine->decode(rows);
                  }
                };
                // One timed run: prefill `depth` (untimed), then n_prompt tokens or n_gen single steps.
                auto run_once = [&](int depth, int n_prompt, int n_gen) {
                  auto& kv = engine->memory();
                  const int seq = kv.create_sequence();
                  if (depth > 0) feed(seq, random_tokens(depth));
                  const auto prompt = random_tokens(n_prompt), gen = random_tokens(n_gen);
                  const auto t0 = std::chrono::steady_clock::now();
                  if (n_prompt > 0) feed(seq, prompt);
                  // step(): the logits come back into buffers reused from step to step, as llama.cpp's do.
                  for (int i = 0; i < n_gen; ++i) engine->step({{seq, gen[i], true}});
                  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                  kv.free_sequence(seq);
                  return s;
                };
                // After the text prompt and one round (untimed: the draft catches up with the prompt there),
                // n_gen greedy tokens, speculative with a draft. Returns the seconds; adds the drafts to `stats`.
                auto run_text = [&](int n_gen, DraftStats* stats) {
                  auto& kv = engine->memory();
                  const int seq = kv.create_sequence(false);
                  SpeculativeDecoder decoder(*engine, draft.get());
                  std::vector<float> logits = decoder.prefill(seq, prompt_tokens);
                  std::vector<int32_t> history = prompt_tokens, out;
                  history.push_back(argmax_logits(logits.data(), hp.n_vocab));
                  SamplingParams greedy;
                  greedy.temperature = 0;
                  Sampler sampler(greedy, hp.n_vocab);
                  decoder.round(seq, history, 1 + dargs.params.n_max, sampler, true, out);
                  const DraftStats before = decoder.stats();
                  const auto t0 = std::chrono::steady_clock::now();
                  for (int done = 0; done < n_gen; done += (int)out.size()) {
                    out.clear();
                    decoder.round(seq, history, n_gen - done, sampler, true, out);
                  }
                  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                  if (stats) {
                    const DraftStats& after = decoder.stats();
                    stats->drafts += after.drafts - before.drafts;
                    stats->drafted += after.drafted - before.drafted;
                    stats->accepted += after.accepted - before.accepted;
                  }
                  decoder.release(seq);
                  kv.free_sequence(seq);
                  return s;
                };
                // n_par sequences: prefill all (timed), then n_gen steps of n_par tokens (timed).
                auto run_parallel = [&](int n_par, int n_prompt, int n_gen) {
                  auto& kv = engine->memory();
                  std::vector<int> seqs;
                  for (int i = 0; i < n_par; ++i) seqs.push_back(kv.create_sequence());
                  const auto t0 = std::chrono::steady_clock::now();
                  std::vector<Engine::BatchRow> rows;
                  for (int sidx = 0; sidx < n_par; ++sidx)
                    for (int32_t tok : random_tokens(n_prompt)) {
                      rows.push_back({seqs[sidx], tok, false});
                      if ((int)rows.size() == cfg.n_batch) {
                        engine->decode(rows);
                        rows.clear();
                      }
                    }
                  if (!rows.empty()) engine->decode(rows);
                  const auto t1 = std::chrono::steady_clock::now();
                  for (int step = 0; step < n_gen; ++step) {
                    std::vector<Engine::BatchRow> batch;
                    for (int sidx = 0; sidx < n_par; ++sidx) batch.push_back({seqs[sidx], (int32_t)(rng() % hp.n_vocab), true});
                    engine->step(batch);  // every row's logits copied back, as llama-batched-bench's
                  }
                  const auto t2 = std::chrono::steady_clock::now();
                  for (int s : seqs) kv.free_sequence(s);
                  return std::make_pair(std::chrono::duration<double>(t1 - t0).count(), std::chrono::duration<double>(t2 - t1).count());
                };
                auto base_result = [&](int p, int n, int d, int np) {
                  TestResult r;
                  r.model_desc = model->description();
                  r.model_file = mpath;
                  r.model_size = model_size;
                  r.n_params = model->n_params();
                  r.backend = backend;
                  r.cfg = cfg;
                  r.n_prompt = p;
                  r.n_gen = n;
                  r.n_depth = d;
                  r.n_parallel = np;
                  r.gpu_units = units;
                  return r;
                };
                auto finish = [&](TestResult& r, double depth_avg, bool decode, double tokens_per_sample_flops) {
                  double sum = 0;
                  for (double x : r.samples_ts) sum += x;
                  r.avg_ts = sum / r.samples_ts.size();
                  double var = 0;
                  for (double x : r.samples_ts) var += (x - r.avg_ts) * (x - r.avg_ts);
                  r.stddev_ts = r.samples_ts.size() > 1 ? std::sqrt(var / (r.samples_ts.size() - 1)) : 0;
                  const DType dk = parse_cache_type(r.cfg.ctk), dv = parse_cache_type(r.cfg.ctv);
                  if (decode) {
                    // The backends run one after another (layer split), so the step's bound is the sum of
                    // each one's bytes over its bandwidth (every GPU taken as fast as GPU 0).
                    const auto bytes = bytes_per_backend(*model, placed, depth_avg, dk, dv);
                    const double per_step = r.avg_ts / r.n_parallel;  // steps per second
                    double step_time = 0, total = 0;
                    for (size_t i = 0; i < placed.size(); ++i) {
                      step_time += bytes[i] / ((placed[i].gpu ? gpu_bw : host_bw) * 1e9);
                      total += bytes[i];
                      r.devices.push_back({placed[i].backend, bytes[i], per_step * bytes[i] / 1e9});
                    }
                    r.gbps = per_step * total / 1e9;
                    r.roofline_ts = r.n_parallel / step_time;
                    r.roofline_pct = 100.0 * r.avg_ts / r.roofline_ts;
                  } else {
                    r.tflops = r.avg_ts * flops_per_token(*model, tokens_per_sample_flops, /*with_output=*/false) / 1e12;
                  }
                  results.push_back(r);
                  log_info("{} {}: {:.2f} t/s", mpath, r.test, r.avg_ts);
                };
                for (int d : d_list) {
                  for (int p : p_list) {
                    if (p <= 0) continue;
                    if (!no_warmup) run_once(d, std::min(p, cfg.n_batch), 0);
                    TestResult r = base_result(p, 0, d, 1);
                    r.test = fmt::format("pp{}", p) + (d > 0 ? fmt::format(" @ d{}", d) : "");
                    for (int rep = 0; rep < reps; ++rep) r.samples_ts.push_back(p / run_once(d, p, 0));
                    finish(r, d + p / 2.0, false, d + p / 2.0);
                  }
                  for (int n : n_list) {
                    if (n <= 0) continue;
                    if (text_tg) {
                      if (d != d_list.front()) continue;  // -d does not apply to the text tests
                      if (!no_warmup) run_text(std::min(n, 8), nullptr);
                      const int P = (int)prompt_tokens.size();
                      TestResult r = base_result(0, n, P, 1);
                      r.speculative = draft != nullptr;
                      r.test = fmt::format("tg{} @ p{}", n, P) + (draft ? fmt::format(" +{}{}", dargs.mtp() ? "mtp" : "md", dargs.params.n_max) : "");
                      for (int rep = 0; rep < reps; ++rep) r.samples_ts.push_back(n / run_text(n, &r.draft));
                      finish(r, P + n / 2.0, !r.speculative, P + n / 2.0);
                      continue;
                    }
                    // With every layer on a GPU the warm-up is the measured run itself: its steps capture the CUDA graphs
                    // each depth's attention grid takes (~5 ms each), which would otherwise land in the first
                    // repetition; a server's warm-up takes them before it serves (engine/warm_up.h).
                    if (!no_warmup) run_once(d, 0, graph_warm_up ? n : std::min(n, 4));
                    TestResult r = base_result(0, n, d, 1);
                    r.test = fmt::format("tg{}", n) + (d > 0 ? fmt::format(" @ d{}", d) : "");
                    for (int rep = 0; rep < reps; ++rep) r.samples_ts.push_back(n / run_once(d, 0, n));
                    finish(r, d + n / 2.0, true, 0);
                  }
                  for (auto [pp, tg] : pg_tests) {
                    TestResult r = base_result(pp, tg, d, 1);
                    r.test = fmt::format("pp{}+tg{}", pp, tg) + (d > 0 ? fmt::format(" @ d{}", d) : "");
                    for (int rep = 0; rep < reps; ++rep) r.samples_ts.push_back((pp + tg) / run_once(d, pp, tg));
                    finish(r, d + pp + tg / 2.0, false, d + pp / 2.0);
                  }
                }
                for (int np : npl)
                  for (int p : p_list)
                    for (int n : n_list) {
                      if (!no_warmup) run_parallel(np, graph_warm_up ? p : std::min(p, 8), graph_warm_up ? n : 2);
                      TestResult rp = base_result(p, 0, 0, np), rg = base_result(0, n, 0, np);
                      rp.test = fmt::format("pp{} x{}", p, np);
                      rg.test = fmt::format("tg{} x{}", n, np);
                      for (int rep = 0; rep < reps; ++rep) {
                        const auto [tp, tgs] = run_parallel(np, p, n);
                        rp.samples_ts.push_back((double)np * p / tp);
                        rg.samples_ts.push_back((double)np * n / tgs);
                      }
                      rp.n_parallel = 1;
                      finish(rp, p / 2.0, false, p / 2.0);
                      finish(rg, p + n / 2.0, true, 0);
                    }
              }
  }

  const std::string env = fmt::format("roofline {} (commit {}), {}", ROOFLINE_VERSION, ROOFLINE_GIT_COMMIT, gpu_build_info());
  if (output == "json") {
    nlohmann::ordered_json arr = nlohmann::ordered_json::array();
    for (const TestResult& r : results) {
      arr.push_back({{"build_commit", ROOFLINE_GIT_COMMIT}, {"environment", env}, {"gpu_info", gpu_name},
                     {"model_filename", r.model_file}, {"model_type", r.model_desc}, {"model_size", r.model_size},
                     {"model_n_params", r.n_params}, {"backends", r.backend}, {"n_batch", r.cfg.n_batch},
                     {"n_threads", r.cfg.n_threads}, {"type_k", r.cfg.ctk}, {"type_v", r.cfg.ctv}, {"n_gpu_layers", r.gpu_units},
                     {"n_prompt", r.n_prompt}, {"n_gen", r.n_gen}, {"n_depth", r.n_depth}, {"n_parallel", r.n_parallel},
                     {"test", r.test}, {"avg_ts", r.avg_ts}, {"stddev_ts", r.stddev_ts}, {"samples_ts", r.samples_ts},
                     {"host_read_gbps", host_bw}, {"gpu_read_gbps", gpu_bw}, {"gbps", r.gbps}, {"roofline_ts", r.roofline_ts},
                     {"roofline_pct", r.roofline_pct}, {"tflops", r.tflops}});
      if (r.speculative) {
        arr.back()["draft_n"] = r.draft.drafted;
        arr.back()["draft_n_accepted"] = r.draft.accepted;
        arr.back()["drafts"] = r.draft.drafts;
      }
      if (!r.devices.empty()) {
        nlohmann::ordered_json devs = nlohmann::ordered_json::array();
        for (const auto& d : r.devices) devs.push_back({{"name", d.name}, {"bytes_per_step", d.bytes_per_step}, {"gbps", d.gbps}});
        arr.back()["devices"] = devs;
      }
    }
    std::printf("%s\n", arr.dump(2).c_str());
    return 0;
  }
  if (output == "csv") {
    std::printf("build_commit,model_filename,model_type,model_size,model_n_params,backends,n_gpu_layers,n_threads,type_k,type_v,"
                "n_batch,n_prompt,n_gen,n_depth,n_parallel,test,avg_ts,stddev_ts,gbps,roofline_ts,roofline_pct,tflops\n");
    for (const TestResult& r : results)
      std::printf("%s,\"%s\",\"%s\",%llu,%llu,%s,%d,%d,%s,%s,%d,%d,%d,%d,%d,%s,%.4f,%.4f,%.2f,%.2f,%.2f,%.4f\n",
                  ROOFLINE_GIT_COMMIT, r.model_file.c_str(), r.model_desc.c_str(), (unsigned long long)r.model_size,
                  (unsigned long long)r.n_params, r.backend.c_str(), r.gpu_units, r.cfg.n_threads, r.cfg.ctk.c_str(),
                  r.cfg.ctv.c_str(), r.cfg.n_batch, r.n_prompt, r.n_gen, r.n_depth, r.n_parallel, r.test.c_str(), r.avg_ts,
                  r.stddev_ts, r.gbps, r.roofline_ts, r.roofline_pct, r.tflops);
    return 0;
  }
  std::printf("| model | size | params | backend | ngl | threads | type_k | type_v | test | t/s | GB/s | roofline t/s | %% roofline |\n");
  std::printf("| --- | ---: | ---: | --- | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |\n");
  for (const TestResult& r : results) {
    const bool decode = r.n_gen > 0 && r.n_prompt == 0 && !r.speculative;
    if (r.speculative) {  // several tokens per target step: no one-step roofline
      std::printf("| %s | %s | %s | %s | %d | %d | %s | %s | %s | %.2f ± %.2f | - | - | - |\n", r.model_desc.c_str(),
                  human_size(r.model_size).c_str(), human_params(r.n_params).c_str(), r.backend.c_str(), r.gpu_units,
                  r.cfg.n_threads, r.cfg.ctk.c_str(), r.cfg.ctv.c_str(), r.test.c_str(), r.avg_ts, r.stddev_ts);
      continue;
    }
    const std::string gb = decode ? fmt::format("{:.1f}", r.gbps) : fmt::format("{:.1f} TFLOP/s", r.tflops);
    const std::string roof = decode ? fmt::format("{:.1f}", r.roofline_ts) : "-";
    const std::string pct = decode ? fmt::format("{:.0f}%", r.roofline_pct) : "-";
    std::printf("| %s | %s | %s | %s | %d | %d | %s | %s | %s | %.2f ± %.2f | %s | %s | %s |\n", r.model_desc.c_str(),
                human_size(r.model_size).c_str(), human_params(r.n_params).c_str(), r.backend.c_str(), r.gpu_units,
                r.cfg.n_threads, r.cfg.ctk.c_str(), r.cfg.ctv.c_str(), r.test.c_str(), r.avg_ts, r.stddev_ts, gb.c_str(),
                roof.c_str(), pct.c_str());
  }
  for (const TestResult& r : results) {
    if (!r.speculative) continue;
    const double steps = (double)(r.draft.drafts > 0 ? r.draft.drafts : 1);
    std::printf("\n%s %s: draft acceptance %lld/%lld = %.1f%% (drafts per round %.2f, accepted per round %.2f)", r.model_desc.c_str(),
                r.test.c_str(), (long long)r.draft.accepted, (long long)r.draft.drafted, 100.0 * r.draft.acceptance(),
                r.draft.drafted / steps, r.draft.accepted / steps);
  }
  for (const TestResult& r : results) {
    if (r.devices.size() < 2) continue;
    std::string line;
    for (const auto& d : r.devices) line += fmt::format("{}{} {:.0f} GB/s", line.empty() ? "" : ", ", d.name, d.gbps);
    std::printf("\n%s %s: per device %s", r.model_desc.c_str(), r.test.c_str(), line.c_str());
  }
  std::printf("\nroofline: read bandwidth host %.1f GB/s%s (measured now); decode bound = bytes a token reads / bandwidth\n",
              host_bw, use_gpu ? fmt::format(", GPU {:.0f} GB/s ({})", gpu_bw, gpu_name).c_str() : "");
  std::printf("build: %s\n", env.c_str());
  return 0;
}

int run_bench(int argc, char** argv) { return run_guarded(run, argc, argv); }
const CommandRegistration registration{"bench", "measure prefill and decode speed against the bandwidth roofline", run_bench, 40};

}  // namespace
}  // namespace roofline::cli
