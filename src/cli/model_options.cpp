// Shared model options: flag definitions and loading.
#include "cli/model_options.h"

#include "cli/command.h"
#include "core/error.h"
#include "engine/placement.h"
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
  app.add_option("--tensor-split", a.tensor_split, "share of the offloaded layers per GPU, e.g. 3,1 (-ts; default: by free memory)")
      ->envname("LLAMA_ARG_TENSOR_SPLIT");
  app.add_option("--vram-limit", a.vram_limit, "use at most this many GiB on each GPU (one value, or one per GPU: 24,24)");
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
  if (text.empty() || *end || v < 0 || v > 100000) fail("-ngl '{}': expected a number, auto or all", text);
  return (int)v;
}

int parse_args(CLI::App& app, int argc, char** argv) { return parse_args(app, normalize_llama_flags(argc, argv)); }

int parse_args(CLI::App& app, const std::vector<std::string>& args) {
  std::vector<const char*> cargs;
  for (auto& s : args) cargs.push_back(s.c_str());
  try {
    app.parse((int)cargs.size(), cargs.data());
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return -1;
}

DType parse_cache_type(const std::string& name) {
  auto t = dtype_from_name(name);
  if (!t || (*t != DType::F32 && *t != DType::F16 && *t != DType::BF16 && *t != DType::Q8_0 && *t != DType::Q4_0))
    fail("unknown KV cache type '{}' (use f16, bf16, q8_0 or q4_0)", name);
  return *t;
}

std::shared_ptr<const Model> load_model(const ModelArgs& a) {
  ModelFileOptions options;
  options.tokenizer_path = a.tokenizer;
  options.n_threads = a.n_threads;
  return Model::load(open_model_file(a.model, options));
}

std::unique_ptr<Engine> create_engine(std::shared_ptr<const Model> model, const ModelArgs& a) {
  EngineOptions o;
  o.n_ctx = a.n_ctx;
  o.n_threads = a.n_threads;
  o.n_batch = a.n_batch;
  o.type_k = parse_cache_type(a.cache_type_k);
  o.type_v = parse_cache_type(a.cache_type_v);
  o.n_gpu_layers = parse_gpu_layers(a.n_gpu_layers);
  o.main_gpu = a.main_gpu;
  o.n_seq_max = a.n_seq_max;
  o.n_state_snapshots = a.n_state_snapshots;
  apply_split_options(o, a.split_mode, a.tensor_split, a.vram_limit);
  return Engine::create(std::move(model), o);
}

std::shared_ptr<const Tokenizer> load_tokenizer(const Model& model) { return Tokenizer::from_metadata(model.metadata()); }

}  // namespace roofline::cli
