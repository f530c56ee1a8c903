// Shared model options: flag definitions and loading.
#include "cli/model_options.h"

#include "cli/command.h"
#include "core/error.h"
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
  app.add_option("--main-gpu", a.main_gpu, "GPU to use (-mg)")->capture_default_str()->envname("LLAMA_ARG_MAIN_GPU");
}

int parse_gpu_layers(const std::string& text) {
  if (text == "auto") return EngineOptions::kGpuLayersAuto;
  if (text == "all") return EngineOptions::kGpuLayersAll;
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end || v < 0 || v > 100000) fail("-ngl '{}': expected a number, auto or all", text);
  return (int)v;
}

int parse_args(CLI::App& app, int argc, char** argv) {
  auto args = normalize_llama_flags(argc, argv);
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
  return Engine::create(std::move(model), o);
}

std::shared_ptr<const Tokenizer> load_tokenizer(const Model& model) { return Tokenizer::from_metadata(model.metadata()); }

}  // namespace roofline::cli
