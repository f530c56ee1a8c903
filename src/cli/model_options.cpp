// Shared model options: flag definitions, parsing (llama.cpp's habits, one exit-status rule), checks
// of the values before anything is loaded, and loading.
#include "cli/model_options.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <thread>

#include "backend/gpu.h"
#include "cli/command.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/memory_plan.h"
#include "engine/placement.h"
#include "engine/roofline_model.h"
#include "model/model_file.h"

namespace roofline::cli {

void add_model_options(CLI::App& app, ModelArgs& a, bool model_required) {
  auto* m = app.add_option("-m,--model", a.model, "model: a GGUF file, or synthetic:SHAPE:MIX (random weights)");
  if (model_required) m->required();
  m->envname("LLAMA_ARG_MODEL");
  app.add_option("--tokenizer", a.tokenizer, "tokenizer.json or GGUF vocabulary for a synthetic model");
  app.add_option("-c,--ctx-size", a.n_ctx, "context size in tokens (0: the model's, capped)")->envname("LLAMA_ARG_CTX_SIZE");
  app.add_option("-t,--threads", a.n_threads, "CPU threads (0: all cores)")->envname("LLAMA_ARG_THREADS");
  app.add_option("-b,--batch-size", a.n_batch, "most tokens per forward step")->capture_default_str()->envname("LLAMA_ARG_BATCH");
  app.add_option("--cache-type-k", a.cache_type_k, "K cache type: f16, bf16, q8_0, q4_0 (-ctk)")
      ->capture_default_str()->envname("LLAMA_ARG_CACHE_TYPE_K");
  app.add_option("--cache-type-v", a.cache_type_v, "V cache type: f16, bf16, q8_0, q4_0 (-ctv)")
      ->capture_default_str()->envname("LLAMA_ARG_CACHE_TYPE_V");
  app.add_option("--n-gpu-layers,--gpu-layers", a.n_gpu_layers,
                 "units on the GPU: a number (the output layer counts as one, offloaded first), auto or all (-ngl)")
      ->capture_default_str()->envname("LLAMA_ARG_N_GPU_LAYERS");
  app.add_option("--main-gpu", a.main_gpu, "GPU to use with -sm none (-mg)")->capture_default_str()->envname("LLAMA_ARG_MAIN_GPU");
  app.add_option("--split-mode", a.split_mode, "several GPUs: none, layer (each GPU a range of layers) or row (-sm)")
      ->capture_default_str()->envname("LLAMA_ARG_SPLIT_MODE");
  app.add_option("--tensor-split", a.tensor_split, "share of the offloaded layers (-sm layer) or of each layer's heads and FFN (-sm row) per GPU, e.g. 3,1 (-ts; default: by free memory)")
      ->envname("LLAMA_ARG_TENSOR_SPLIT");
  app.add_option("--vram-limit", a.vram_limit, "use at most this many GiB on each GPU (one value, or one per GPU: 24,24)");
  add_device_option(app, a.device);
  add_moe_placement_options(app, a);
  add_f16_copies_option(app, a);
}

void add_f16_copies_option(CLI::App& app, ModelArgs& a) {
  app.add_option("--f16-copies", a.f16_copies,
                 "f16 copies of the GPU layers' weights, made last from the memory left, so prompts skip dequantizing them: auto "
                 "(where they fit), on (all, or an error), off (leave that memory free), or at most this many GiB per GPU")
      ->capture_default_str();
}

F16Copies parse_f16_copies(const std::string& text, double& max_gib) {
  max_gib = 0;
  if (text == "auto") return F16Copies::Auto;
  if (text == "on") return F16Copies::On;
  if (text == "off") return F16Copies::Off;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end || !(v > 0 && v < 1e6)) fail("--f16-copies '{}': expected auto, on, off or a size in GiB", text);
  max_gib = v;
  return F16Copies::Auto;
}

void add_device_option(CLI::App& app, std::string& device) {
  app.add_option("--device", device,
                 "the GPUs to use, in order: CUDA0,CUDA1 or 0,1 (-dev; default: every GPU; none: no GPU). A GPU listed twice "
                 "runs two backends on it, to try a split on one GPU")
      ->envname("LLAMA_ARG_DEVICE");
}

std::vector<int> parse_device_list(const std::string& device) {
  std::vector<int> ids;
  size_t start = 0;
  for (;;) {
    const size_t comma = device.find(',', start);
    std::string item = device.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (item.rfind("CUDA", 0) == 0) item = item.substr(4);
    char* end = nullptr;
    const long id = item.empty() ? -1 : std::strtol(item.c_str(), &end, 10);
    if (id < 0 || id > 1023 || *end) fail("--device '{}': expected GPUs as CUDA0,CUDA1 (or 0,1), or none", device);
    ids.push_back((int)id);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return ids;
}

void apply_device_option(EngineOptions& o, const std::string& device) {
  if (device.empty()) return;
  if (device == "none") o.n_gpu_layers = 0;
  else o.gpu_ids = parse_device_list(device);
}

void add_moe_placement_options(CLI::App& app, ModelArgs& a) {
  app.add_flag("--cpu-moe", a.cpu_moe, "MoE models: keep every layer's experts in host memory, run by the CPU (-cmoe)")
      ->envname("LLAMA_ARG_CPU_MOE");
  app.add_option("--n-cpu-moe", a.n_cpu_moe, "MoE models: keep the experts of the first N layers in host memory (-ncmoe)")
      ->envname("LLAMA_ARG_N_CPU_MOE");
  app.add_option("--override-tensor", a.override_tensor,
                 "REGEX=CPU: tensors matching REGEX stay in host memory (MoE experts only; -ot, repeatable, comma-separated)");
}

std::vector<std::string> parse_override_tensor(const std::vector<std::string>& values) {
  std::vector<std::string> patterns;
  for (const std::string& value : values) {
    size_t start = 0;
    for (;;) {
      const size_t comma = value.find(',', start);
      const std::string item = value.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      const size_t eq = item.rfind('=');
      if (eq == std::string::npos || eq == 0) fail("-ot '{}': expected REGEX=CPU", item);
      std::string buft = item.substr(eq + 1);
      for (char& c : buft) c = (char)std::toupper((unsigned char)c);
      if (buft != "CPU")
        fail("-ot '{}': only CPU is supported as the buffer type (tensors kept in host memory), not '{}'", item, item.substr(eq + 1));
      patterns.push_back(item.substr(0, eq));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  return patterns;
}

void apply_split_options(EngineOptions& o, const std::string& split_mode, const std::string& tensor_split,
                         const std::string& vram_limit) {
  if (split_mode == "none") o.split_mode = EngineOptions::SplitMode::None;
  else if (split_mode == "layer") o.split_mode = EngineOptions::SplitMode::Layer;
  else if (split_mode == "row") o.split_mode = EngineOptions::SplitMode::Row;
  else fail("-sm '{}': expected none, layer or row", split_mode);
  o.tensor_split = parse_proportions(tensor_split, "-ts");
  if (!vram_limit.empty()) {
    o.vram_limit_gib.clear();
    for (double v : parse_proportions(vram_limit, "--vram-limit")) o.vram_limit_gib.push_back(v);
  }
}

int parse_gpu_layers(const std::string& text) {
  if (text == "auto") return EngineOptions::kGpuLayersAuto;
  if (text == "all") return EngineOptions::kGpuLayersAll;
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end) usage_fail("-ngl '{}': expected a number, auto or all", text);
  if (v == -1) return EngineOptions::kGpuLayersAuto;  // llama.cpp's default value
  if (v < 0 || v > 100000) fail("-ngl {}: expected 0..100000, auto or all", text);
  return (int)v;
}

int cap_threads(int n_threads) {
  const int cores = (int)std::max(1u, std::thread::hardware_concurrency());
  return n_threads <= 0 ? 0 : std::min(n_threads, cores);  // 0: every core
}

int resolve_threads(int n_threads) {
  const int capped = cap_threads(n_threads);
  if (capped < n_threads) log_warn("-t {} is more than the {} cores of this machine; using {}", n_threads, capped, capped);
  return capped;
}

EngineOptions engine_options(const ModelArgs& a) {
  EngineOptions o;
  if (a.n_ctx < 0) fail("-c {}: the context size cannot be negative (0: the model's)", a.n_ctx);
  if (a.n_batch <= 0) fail("-b {}: the batch size must be at least 1", a.n_batch);
  o.n_ctx = a.n_ctx;
  o.n_threads = a.n_threads;
  o.n_batch = a.n_batch;
  o.type_k = parse_cache_type(a.cache_type_k);
  o.type_v = parse_cache_type(a.cache_type_v);
  o.n_gpu_layers = parse_gpu_layers(a.n_gpu_layers);
  if (a.main_gpu < 0) fail("-mg {}: expected a GPU index (0, 1, ...)", a.main_gpu);
  o.main_gpu = a.main_gpu;
  o.n_seq_max = a.n_seq_max;
  o.n_state_snapshots = a.n_state_snapshots;
  o.draft_rollback = a.draft_rollback;
  apply_split_options(o, a.split_mode, a.tensor_split, a.vram_limit);
  apply_device_option(o, a.device);
  if (a.n_cpu_moe < 0) fail("--n-cpu-moe {}: expected a number of layers (0 or more)", a.n_cpu_moe);
  o.n_cpu_moe = a.cpu_moe ? EngineOptions::kAllLayers : a.n_cpu_moe;
  o.cpu_tensor_patterns = parse_override_tensor(a.override_tensor);
  o.f16_copies = parse_f16_copies(a.f16_copies, o.f16_copies_max_gib);
  o.defer_f16_copies = a.defer_f16_copies;
  return o;
}

void fit_context(ModelArgs& a, const HParams& hp, int default_cap) {
  if (a.n_ctx == 0) {
    a.n_ctx = std::min(hp.n_ctx_train > 0 ? hp.n_ctx_train : 4096, default_cap);
  } else if (hp.n_ctx_train > 0 && a.n_ctx > hp.n_ctx_train) {
    log_warn("-c {} is more than the model's trained context {}; using {}", a.n_ctx, hp.n_ctx_train, hp.n_ctx_train);
    a.n_ctx = hp.n_ctx_train;
  }
}

void check_sampling(const SamplingParams& sp) {
  if (!std::isfinite(sp.temperature)) fail("--temp {}: expected a number (0 or below: greedy)", sp.temperature);
  if (sp.top_k < 0) fail("--top-k {}: expected 0 (off) or a positive count", sp.top_k);
  if (!(sp.top_p >= 0 && sp.top_p <= 1)) fail("--top-p {}: expected 0..1 (1: off)", sp.top_p);
  if (!(sp.min_p >= 0 && sp.min_p <= 1)) fail("--min-p {}: expected 0..1 (0: off)", sp.min_p);
  if (!(sp.typical_p >= 0 && sp.typical_p <= 1)) fail("--typical {}: expected 0..1 (1: off)", sp.typical_p);
  if (!(sp.repeat_penalty > 0) || !std::isfinite(sp.repeat_penalty))
    fail("--repeat-penalty {}: expected a positive number (1: off)", sp.repeat_penalty);
  if (sp.repeat_last_n < -1) fail("--repeat-last-n {}: expected -1 (the whole context), 0 (off) or a count", sp.repeat_last_n);
  if (!std::isfinite(sp.presence_penalty)) fail("--presence-penalty {}: expected a number", sp.presence_penalty);
  if (!std::isfinite(sp.frequency_penalty)) fail("--frequency-penalty {}: expected a number", sp.frequency_penalty);
}

const char* const kChatMlTemplate =
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

DType parse_cache_type(const std::string& name) {
  auto t = dtype_from_name(name);
  if (!t || (*t != DType::F32 && *t != DType::F16 && *t != DType::BF16 && *t != DType::Q8_0 && *t != DType::Q4_0))
    fail("unknown KV cache type '{}' (use f16, bf16, q8_0 or q4_0)", name);
  return *t;
}

std::shared_ptr<const Model> load_model(const ModelArgs& a) {
  ModelFileOptions options;
  options.tokenizer_path = a.tokenizer;
  options.n_threads = cap_threads(a.n_threads);  // building a synthetic model
  return Model::load(open_model_file(a.model, options));
}

std::unique_ptr<Engine> create_engine(std::shared_ptr<const Model> model, const ModelArgs& a) {
  EngineOptions o = engine_options(a);
  o.n_threads = resolve_threads(a.n_threads);
  // The KV cache of the whole context, wherever it goes, must fit the machine's memory at least: a
  // context far beyond it is refused with the size it needs, not an allocator's message.
  const int n_ctx = o.n_ctx > 0 ? o.n_ctx : std::min(model->hparams().n_ctx_train, 4096);
  // Sliding-window layers (gemma3) keep a ring of about the window plus a batch per sequence instead.
  const HParams& hp = model->hparams();
  const double row = (double)(dtype_row_bytes(o.type_k, hp.kv_dim_k()) + dtype_row_bytes(o.type_v, hp.kv_dim_v()));
  const KvConfig kv = planned_kv_config(hp, n_ctx, o.n_batch, o.kv_block_size, o.type_k, o.type_v);
  const int ring = kv.swa_ring, snapshot_positions = kv.swa_snapshot_blocks * kv.block_size;
  const bool windowed = kv.swa_snapshot_blocks > 0;  // window snapshots, else ring snapshots in state cells
  double need = 0;
  for (int il = 0; il < hp.n_layer; ++il)
    if (hp.has_kv(il))
      need += row * (hp.is_sliding(il) ? (double)ring * (o.n_seq_max + (windowed ? 0 : o.n_state_snapshots)) +
                                             (double)snapshot_positions * (windowed ? o.n_state_snapshots : 0)
                                       : (double)n_ctx);
  const double per_pos = need / n_ctx;
  double memory = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
  struct rlimit as_limit {};
  if (getrlimit(RLIMIT_AS, &as_limit) == 0 && as_limit.rlim_cur != RLIM_INFINITY)
    memory = std::min(memory, (double)as_limit.rlim_cur);  // ulimit -v: what this process may map
  if (o.n_gpu_layers != 0)
    for (const GpuInfo& g : gpu_devices()) memory += (double)g.total_bytes;
  auto too_big = [&] {
    return fmt::format("-c {} needs {:.1f} GiB of KV cache ({:.1f} KiB per position with K {} and V {}), more than the {:.1f} GiB of "
                       "memory this process may use; lower -c, or use -ctk/-ctv q8_0",
                       n_ctx, need / 1073741824.0, per_pos / 1024.0, a.cache_type_k, a.cache_type_v, memory / 1073741824.0);
  };
  if (memory > 0 && need > memory) fail("{}", too_big());
  try {
    return Engine::create(std::move(model), o);
  } catch (const std::bad_alloc&) {
    fail("out of memory creating the engine (-c {}: {:.2f} GiB of KV cache, {:.1f} KiB per position); lower -c or -ngl",
         n_ctx, need / 1073741824.0, per_pos / 1024.0);
  } catch (const std::length_error&) {
    fail("{}", too_big());
  }
}

std::shared_ptr<const Tokenizer> load_tokenizer(const Model& model) { return Tokenizer::from_metadata(model.metadata()); }

}  // namespace roofline::cli
