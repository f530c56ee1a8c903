// Options shared by the commands that load a model (run, bench, serve, perplexity, ...): the flags
// as llama.cpp spells them, and the steps from flags to a Model, an Engine and a Tokenizer.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace roofline::cli {

struct ModelArgs {
  std::string model;       // -m: GGUF path or synthetic:SHAPE:MIX
  std::string tokenizer;   // --tokenizer for synthetic models
  int n_ctx = 0;           // -c
  int n_threads = 0;       // -t
  int n_batch = 512;       // -b
  std::string cache_type_k = "f16";  // -ctk
  std::string cache_type_v = "f16";  // -ctv
  std::string n_gpu_layers = "auto";  // -ngl: a number, auto or all
  int main_gpu = 0;                   // -mg
  std::string split_mode = "layer";   // -sm: none, layer or row
  std::string tensor_split;           // -ts: proportions per GPU, e.g. 3,1
  std::string vram_limit;             // --vram-limit: GiB per GPU (one value: every GPU)
  std::string device;                 // -dev: the GPUs, in order (CUDA0,CUDA1 or 0,1; none: no GPU)
  bool cpu_moe = false;                    // --cpu-moe: every MoE layer's experts in host memory
  int n_cpu_moe = 0;                       // --n-cpu-moe N: the first N layers' experts in host memory
  std::vector<std::string> override_tensor;  // -ot REGEX=CPU[,REGEX=CPU...]
  std::string f16_copies = "auto";           // --f16-copies auto|on|off|GIB (EngineOptions::f16_copies)
  bool defer_f16_copies = false;             // EngineOptions::defer_f16_copies (a draft engine comes next)
  // Set by the command (not flags): sequences alive at once and state snapshots kept for prompt
  // caching, for models with recurrent layers (EngineOptions::n_seq_max, n_state_snapshots).
  int n_seq_max = 1;
  int n_state_snapshots = 0;
  bool draft_rollback = false;  // speculative decoding (EngineOptions::draft_rollback)
};

// -ot values ("REGEX=CPU", several joined by commas, as llama.cpp takes them) into the regexes whose
// tensors stay in host memory; Error for another buffer type.
std::vector<std::string> parse_override_tensor(const std::vector<std::string>& values);
// --f16-copies (serve, run, bench, perplexity): f16 copies of the GPU weights for prompt steps.
void add_f16_copies_option(CLI::App& app, ModelArgs& a);
// auto, on, off, or a size in GiB (auto, at most that much: max_gib).
F16Copies parse_f16_copies(const std::string& text, double& max_gib);
// Adds --cpu-moe, --n-cpu-moe and -ot/--override-tensor (MoE experts in host memory).
void add_moe_placement_options(CLI::App& app, ModelArgs& args);

// -sm/-ts/--vram-limit into engine options (Error on bad values; -sm row is refused on every machine).
// -dev/--device (llama.cpp's): the GPUs to use, in order, into EngineOptions::gpu_ids; "none" keeps every layer on
// the CPU. One line on anything else.
void add_device_option(CLI::App& app, std::string& device);
void apply_device_option(EngineOptions& o, const std::string& device);
// "CUDA0,CUDA1" or "0,1" -> {0, 1} (a GPU may repeat); one line on anything else.
std::vector<int> parse_device_list(const std::string& device);
void apply_split_options(EngineOptions& o, const std::string& split_mode, const std::string& tensor_split,
                         const std::string& vram_limit);

// The engine options the flags ask for, every value checked (Error naming the flag otherwise): what
// commands call before loading a model, so a bad value fails at once.
EngineOptions engine_options(const ModelArgs& args);

// -t as llama.cpp takes it: 0 or negative means every core; more threads than cores are capped (a
// warning says so), since the thread pool's workers spin and oversubscription only slows them.
int resolve_threads(int n_threads);
// The same without the warning, for the commands' own pools (quantize, convert, synth, perplexity, imatrix,
// a synthetic model's builder): -t 100000 started that many threads.
int cap_threads(int n_threads);

// The context for a model (run, chat, serve): 0 takes the trained context capped at `default_cap`;
// more than the trained context is capped to it with a warning, as llama-server does.
void fit_context(ModelArgs& args, const HParams& hp, int default_cap);

// "auto" -> kGpuLayersAuto, "all" -> kGpuLayersAll, else a non-negative number (Error otherwise).
int parse_gpu_layers(const std::string& text);

// Adds -m/--model, --tokenizer, -c/--ctx-size, -t/--threads, -b/--batch-size, -ctk/--cache-type-k,
// -ctv/--cache-type-v, -ngl/--n-gpu-layers, -mg/--main-gpu, -sm/--split-mode, -ts/--tensor-split,
// --vram-limit, --cpu-moe, --n-cpu-moe, -ot/--override-tensor.
void add_model_options(CLI::App& app, ModelArgs& args, bool model_required = true);

// Sampling flags checked against llama.cpp's conventions (--top-k 0 is off, --top-p 1 is off, --temp
// 0 or below is greedy): a value outside them is an Error naming the flag.
void check_sampling(const SamplingParams& sp);

// A ChatML template for models that carry none (llama-server falls back to ChatML too).
extern const char* const kChatMlTemplate;

DType parse_cache_type(const std::string& name);  // f32|f16|bf16|q8_0|q4_0, else Error
std::shared_ptr<const Model> load_model(const ModelArgs& args);
// The engine for `model`; a KV cache larger than the machine's memory is refused with the size it needs.
std::unique_ptr<Engine> create_engine(std::shared_ptr<const Model> model, const ModelArgs& args);
std::shared_ptr<const Tokenizer> load_tokenizer(const Model& model);

}  // namespace roofline::cli
