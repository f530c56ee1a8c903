// `roofline bench`: prefill (pp) and decode (tg) speed measured separately, as llama-bench does, plus
// the achieved read rate (GB/s) and the fraction of the roofline: measured read bandwidth divided by
// the bytes a decode token reads (weights, one embedding row, the KV cache at that depth).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "cli/command.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "engine/roofline_model.h"
#include "roofline_version.h"

namespace roofline::cli {
namespace {

std::vector<int> parse_int_list(const std::string& s, const char* what) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end || v < 0 || v > (1 << 24)) fail("bad {} value '{}' (a comma-separated list of numbers)", what, item);
    out.push_back((int)v);
  }
  return out;
}

std::vector<std::string> parse_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(item);
  return out;
}

struct TestResult {
  std::string model_desc, model_file, backend, type_k, type_v, test;
  uint64_t model_size = 0, n_params = 0;
  int threads = 0, n_prompt = 0, n_gen = 0, n_depth = 0, n_batch = 0;
  std::vector<double> samples_ts;
  double avg_ts = 0, stddev_ts = 0, gbps = 0, roofline_pct = 0, gflops = 0;
};

std::string human_size(uint64_t bytes) {
  const double gib = bytes / 1073741824.0;
  return gib >= 1 ? fmt::format("{:.2f} GiB", gib) : fmt::format("{:.2f} MiB", bytes / 1048576.0);
}
std::string human_params(uint64_t n) {
  return n >= 1000000000ull ? fmt::format("{:.2f} B", n / 1e9) : fmt::format("{:.2f} M", n / 1e6);
}

int run(int argc, char** argv) {
  CLI::App app{"Benchmark prefill and decode speed, with GB/s and % of the memory-bandwidth roofline"};
  std::vector<std::string> models;
  std::string prompts = "512", gens = "128", depths = "0", threads_list, ctk = "f16", ctv = "f16", ngl = "0";
  std::string batch_list = "512", output = "md", tokenizer;
  int reps = 5;
  bool no_warmup = false;
  app.add_option("-m,--model", models, "model files or synthetic:SHAPE:MIX (repeatable)")->required();
  app.add_option("--tokenizer", tokenizer, "tokenizer for synthetic models (not needed for speed)");
  app.add_option("-p,--n-prompt", prompts, "prompt sizes (comma-separated)")->capture_default_str();
  app.add_option("-n,--n-gen", gens, "generated token counts (comma-separated)")->capture_default_str();
  app.add_option("-d,--n-depth", depths, "KV depths prefilled before each test")->capture_default_str();
  app.add_option("-t,--threads", threads_list, "thread counts (default: all cores)");
  app.add_option("-b,--batch-size", batch_list, "batch sizes")->capture_default_str();
  app.add_option("--cache-type-k", ctk, "K cache types (-ctk)")->capture_default_str();
  app.add_option("--cache-type-v", ctv, "V cache types (-ctv)")->capture_default_str();
  app.add_option("--n-gpu-layers", ngl, "layers on the GPU (-ngl; this build runs on the CPU: 0)")->capture_default_str();
  app.add_option("-r,--repetitions", reps, "repetitions per test")->capture_default_str();
  app.add_option("-o,--output", output, "output format: md, json, csv")->capture_default_str();
  app.add_flag("--no-warmup", no_warmup, "skip the warmup run");
  if (int rc = parse_args(app, argc, argv); rc >= 0) return rc;
  if (output != "md" && output != "json" && output != "csv") fail("unknown output format '{}' (md, json, csv)", output);
  if (reps < 1) fail("repetitions must be at least 1");
  for (int g : parse_int_list(ngl, "-ngl"))
    if (g != 0) fail("-ngl {}: this build has no GPU backend (build with -DROOFLINE_CUDA=ON)", g);

  const auto p_list = parse_int_list(prompts, "-p"), n_list = parse_int_list(gens, "-n"), d_list = parse_int_list(depths, "-d");
  const auto b_list = parse_int_list(batch_list, "-b");
  std::vector<int> t_list = threads_list.empty() ? std::vector<int>{ThreadPool::default_thread_count()}
                                                  : parse_int_list(threads_list, "-t");
  const int max_threads = *std::max_element(t_list.begin(), t_list.end());
  log_info("measuring host memory read bandwidth ({} threads)...", max_threads);
  const double host_bw = measure_host_read_bandwidth(max_threads);
  log_info("host read bandwidth: {:.1f} GB/s", host_bw);

  std::vector<TestResult> results;
  std::mt19937 rng(42);
  for (const std::string& mpath : models) {
    ModelArgs margs;
    margs.model = mpath;
    margs.tokenizer = tokenizer;
    auto model = load_model(margs);
    const int n_vocab = model->hparams().n_vocab;
    uint64_t model_size = 0;
    for (const auto& t : model->file().tensors()) model_size += t.n_bytes;
    for (const std::string& tk : parse_list(ctk))
      for (const std::string& tv : parse_list(ctv))
        for (int nb : b_list)
          for (int nt : t_list) {
            int max_ctx = 1;
            for (int d : d_list) {
              for (int p : p_list) max_ctx = std::max(max_ctx, d + p);
              for (int n : n_list) max_ctx = std::max(max_ctx, d + n);
            }
            margs.n_ctx = max_ctx;
            margs.n_threads = nt;
            margs.n_batch = nb;
            margs.cache_type_k = tk;
            margs.cache_type_v = tv;
            auto engine = create_engine(model, margs);
            auto random_tokens = [&](int n) {
              std::vector<int32_t> t((size_t)n);
              for (auto& x : t) x = (int32_t)(rng() % (uint32_t)n_vocab);
              return t;
            };
            // One timed run: prefill `depth` (untimed), then `n_prompt` tokens at once or `n_gen` single steps.
            auto run_once = [&](int depth, int n_prompt, int n_gen) {
              auto& kv = engine->kv_cache();
              const int seq = kv.create_sequence();
              if (depth > 0) engine->eval(seq, random_tokens(depth), false);
              const auto prompt = random_tokens(n_prompt > 0 ? n_prompt : n_gen);
              const auto t0 = std::chrono::steady_clock::now();
              if (n_prompt > 0) {
                engine->eval(seq, prompt, false);
              } else {
                for (int i = 0; i < n_gen; ++i) engine->eval(seq, std::span<const int32_t>(&prompt[i], 1), false);
              }
              const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
              kv.free_sequence(seq);
              return s;
            };
            for (int d : d_list) {
              std::vector<std::pair<int, int>> tests;
              for (int p : p_list)
                if (p > 0) tests.push_back({p, 0});
              for (int n : n_list)
                if (n > 0) tests.push_back({0, n});
              for (auto [p, n] : tests) {
                if (!no_warmup) run_once(d, p > 0 ? std::min(p, 16) : 0, p > 0 ? 0 : std::min(n, 2));
                TestResult r;
                r.model_desc = model->description();
                r.model_file = mpath;
                r.model_size = model_size;
                r.n_params = model->n_params();
                r.backend = "CPU";
                r.threads = nt;
                r.type_k = tk;
                r.type_v = tv;
                r.n_prompt = p;
                r.n_gen = n;
                r.n_depth = d;
                r.n_batch = nb;
                r.test = (p > 0 ? fmt::format("pp{}", p) : fmt::format("tg{}", n)) + (d > 0 ? fmt::format(" @ d{}", d) : "");
                for (int rep = 0; rep < reps; ++rep) r.samples_ts.push_back((p > 0 ? p : n) / run_once(d, p, n));
                double sum = 0;
                for (double x : r.samples_ts) sum += x;
                r.avg_ts = sum / reps;
                double var = 0;
                for (double x : r.samples_ts) var += (x - r.avg_ts) * (x - r.avg_ts);
                r.stddev_ts = reps > 1 ? std::sqrt(var / (reps - 1)) : 0;
                const DType dk = parse_cache_type(tk), dv = parse_cache_type(tv);
                if (n > 0) {
                  const double bytes = decode_bytes_per_token(*model, d + n / 2.0, dk, dv);
                  r.gbps = r.avg_ts * bytes / 1e9;
                  r.roofline_pct = 100.0 * r.gbps / host_bw;
                } else {
                  r.gflops = r.avg_ts * flops_per_token(*model, d + p / 2.0) / 1e9;
                }
                results.push_back(r);
                log_info("{} {}: {:.2f} t/s", mpath, r.test, r.avg_ts);
              }
            }
          }
  }

  if (output == "json") {
    nlohmann::ordered_json arr = nlohmann::ordered_json::array();
    for (const TestResult& r : results) {
      arr.push_back({{"build_commit", ROOFLINE_GIT_COMMIT}, {"model_filename", r.model_file}, {"model_type", r.model_desc},
                     {"model_size", r.model_size}, {"model_n_params", r.n_params}, {"backends", r.backend},
                     {"n_batch", r.n_batch}, {"n_threads", r.threads}, {"type_k", r.type_k}, {"type_v", r.type_v},
                     {"n_gpu_layers", 0}, {"n_prompt", r.n_prompt}, {"n_gen", r.n_gen}, {"n_depth", r.n_depth},
                     {"avg_ts", r.avg_ts}, {"stddev_ts", r.stddev_ts}, {"samples_ts", r.samples_ts},
                     {"read_bandwidth_gbps", host_bw}, {"gbps", r.gbps}, {"roofline_pct", r.roofline_pct},
                     {"gflops", r.gflops}});
    }
    std::printf("%s\n", arr.dump(2).c_str());
    return 0;
  }
  if (output == "csv") {
    std::printf("build_commit,model_filename,model_type,model_size,model_n_params,backends,n_threads,type_k,type_v,n_batch,"
                "n_prompt,n_gen,n_depth,avg_ts,stddev_ts,read_bandwidth_gbps,gbps,roofline_pct,gflops\n");
    for (const TestResult& r : results)
      std::printf("%s,\"%s\",\"%s\",%llu,%llu,%s,%d,%s,%s,%d,%d,%d,%d,%.4f,%.4f,%.2f,%.3f,%.2f,%.2f\n", ROOFLINE_GIT_COMMIT,
                  r.model_file.c_str(), r.model_desc.c_str(), (unsigned long long)r.model_size, (unsigned long long)r.n_params,
                  r.backend.c_str(), r.threads, r.type_k.c_str(), r.type_v.c_str(), r.n_batch, r.n_prompt, r.n_gen,
                  r.n_depth, r.avg_ts, r.stddev_ts, host_bw, r.gbps, r.roofline_pct, r.gflops);
    return 0;
  }
  std::printf("| model | size | params | backend | threads | type_k | type_v | test | t/s | GB/s | %% roofline |\n");
  std::printf("| --- | ---: | ---: | --- | ---: | --- | --- | ---: | ---: | ---: | ---: |\n");
  for (const TestResult& r : results) {
    const std::string gb = r.n_gen > 0 ? fmt::format("{:.1f}", r.gbps) : fmt::format("({:.0f} GFLOP/s)", r.gflops);
    const std::string pct = r.n_gen > 0 ? fmt::format("{:.0f}%", r.roofline_pct) : "-";
    std::printf("| %s | %s | %s | %s | %d | %s | %s | %s | %.2f ± %.2f | %s | %s |\n", r.model_desc.c_str(),
                human_size(r.model_size).c_str(), human_params(r.n_params).c_str(), r.backend.c_str(), r.threads,
                r.type_k.c_str(), r.type_v.c_str(), r.test.c_str(), r.avg_ts, r.stddev_ts, gb.c_str(), pct.c_str());
  }
  std::printf("\nroofline: host read bandwidth %.1f GB/s (measured); %% roofline = achieved GB/s / that.\n", host_bw);
  std::printf("build: %s (roofline %s)\n", ROOFLINE_GIT_COMMIT, ROOFLINE_VERSION);
  return 0;
}

int run_bench(int argc, char** argv) { return run_guarded(run, argc, argv); }
const CommandRegistration registration{"bench", "measure prefill and decode speed against the bandwidth roofline", run_bench, 40};

}  // namespace
}  // namespace roofline::cli
