// The engine: a model placed on backends, the memory sequences carry (a paged KV cache shared by
// sequences, recurrent-state cells for DeltaNet layers: sequence_memory.h), and forward steps over
// batches that mix prefill chunks and decode tokens of many sequences. Logits come back only
// for the rows that want them. Sampling and generation loops sit on top (sampler.h, generate.h).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/sequence_memory.h"
#include "model/model.h"

namespace roofline {

struct EngineOptions {
  int n_ctx = 0;           // KV positions shared by all sequences (0: the model's trained context, capped at 8192)
  int n_threads = 0;       // CPU threads (0: all cores)
  DType type_k = DType::F16;
  DType type_v = DType::F16;
  int n_batch = 512;       // most tokens in one forward step
  int kv_block_size = 32;  // positions per KV block
  // Models with recurrent layers: sequences alive at once (a state cell each), and state snapshots
  // kept for prompt caching (sequence_memory.h; 0: prefixes are not reused).
  int n_seq_max = 4;
  int n_state_snapshots = 0;
  // Speculative decoding on such models: a second state cell per sequence holds the state from before
  // a verification step, to go back to when drafts are rejected (SequenceMemory::roll_back).
  bool draft_rollback = false;
  // Units on the GPU (n_layer + 1 units, the output layer counts as the last): the last N units go
  // to the GPU, as llama.cpp's -ngl. kGpuLayersAuto fits as many as memory allows; kGpuLayersAll all.
  int n_gpu_layers = 0;
  int main_gpu = 0;
  double gpu_margin_gib = 1.0;  // memory left free on the GPU when fitting (-ngl auto)
  // Several GPUs (-sm): none uses main_gpu only; layer gives each GPU a contiguous range of the
  // offloaded units, in proportion to tensor_split (-ts) or else to each GPU's usable memory; row
  // (tensor parallel) gives every GPU the offloaded units, each a slice of every layer's heads and FFN
  // features in those proportions, their partial sums added over the GPUs twice a layer
  // (engine/tensor_parallel.h); rank 0 (the first GPU) also holds the output layer.
  enum class SplitMode { None, Layer, Row };
  SplitMode split_mode = SplitMode::Layer;
  std::vector<double> tensor_split;
  std::vector<double> vram_limit_gib;  // --vram-limit: at most this much memory per GPU (one value: every GPU)
  std::vector<int> gpu_ids;            // the GPUs, in order (empty: every visible GPU); may repeat one (tests)
  // MoE models on a GPU: the experts of the first n_cpu_moe layers (--n-cpu-moe; kAllLayers: --cpu-moe)
  // and of layers with an expert tensor matching a cpu_tensor_patterns regex (-ot REGEX=CPU) stay in
  // host memory and run on the CPU; the rest of those layers runs on the GPU.
  int n_cpu_moe = 0;
  std::vector<std::string> cpu_tensor_patterns;
  // f16 copies of the GPU layers' weight matrices for prompt steps, made last from the memory left
  // (--f16-copies; backend.h F16Copies): faster prompts for memory nothing else was given.
  F16Copies f16_copies = F16Copies::Auto;
  double f16_copies_max_gib = 0;  // auto: at most this much per GPU (--f16-copies GIB; 0: no cap)
  bool defer_f16_copies = false;  // create() leaves them to keep_f16_copies() (a draft engine is loaded first)
  static constexpr int kAllLayers = 1 << 30;

  static constexpr int kGpuLayersAuto = -1;
  static constexpr int kGpuLayersAll = -2;
};

class Engine {
 public:
  static std::unique_ptr<Engine> create(std::shared_ptr<const Model> model, const EngineOptions& options = {});
  ~Engine();

  const Model& model() const { return *model_; }
  const std::shared_ptr<const Model>& model_ptr() const { return model_; }
  const EngineOptions& options() const { return options_; }
  int n_vocab() const { return model_->hparams().n_vocab; }
  SequenceMemory& memory() { return *memory_; }
  const SequenceMemory& memory() const { return *memory_; }

  // One row of a batch. Rows of one sequence are contiguous and continue its cached positions.
  struct BatchRow {
    int seq = 0;
    int32_t token = 0;
    bool want_logits = false;
    // With want_logits, for step(): only the row's greedy token (argmax_logits) is needed; a backend
    // that picks it on the device then sends no logits back for the row.
    bool argmax_only = false;
    // The row's final hidden state (after the output norm) is wanted: embeddings (step(), launch()).
    bool want_hidden = false;
    // With argmax_only: the tokens the argmax may pick (bit t of allowed[t / 64]; nullptr: all), host
    // memory the caller keeps until the step's output is read. Constrained decoding's greedy rows: the
    // best token the grammar allows, -1 if none has a finite logit.
    const uint64_t* allowed = nullptr;
  };
  // Runs one forward step (at most n_batch rows); returns logits [rows wanting them x n_vocab] in row
  // order. Throws Error (leaving the cache as it was) if a sequence cannot get KV blocks.
  std::vector<float> decode(const std::vector<BatchRow>& batch);

  // What step() returns for the rows that want logits (in row order), valid until the next step.
  struct StepOutput {
    std::vector<int32_t> argmax;       // per logit row: its greedy token if it asked for argmax_only, else -1
    std::vector<const float*> logits;  // per logit row: its n_vocab logits; nullptr where only the argmax came back
    std::vector<float> buffer;         // holds the logits (reused from step to step), unless the output backend
                                       // keeps them in host memory of its own (a GPU's pinned buffer)
    std::vector<const float*> hidden;  // per row with want_hidden, in row order: its n_embd final hidden state
    std::vector<float> hidden_buffer;  // holds them
  };
  // decode() for loops that step many times: argmax_only rows get their greedy token (picked on the
  // device when the output backend can, else here), and the buffers are reused (no allocation or
  // zeroing of [rows x n_vocab] per step). With `input` ([rows x n_embd], host memory kept until the
  // step's output is read) the rows start from those hidden states instead of their tokens' embeddings
  // (the tokens then only say which rows they are): the MTP head's block (engine/mtp_drafter.h).
  // The output is valid until the engine's next step(), finish(), decode() or eval(): its logits may be
  // the GPU's pinned staging buffer, which each of them writes.
  const StepOutput& step(const std::vector<BatchRow>& batch, const float* input = nullptr);
  // step() in two halves, so the caller can work while a device computes: launch() checks the batch,
  // reserves its KV blocks and starts the forward pass (a GPU holding the output layer is left running
  // its kernels; CPU layers compute here), finish() waits for it and returns its output. Between them
  // no other engine call, and the KV cache's sequences of the batch must not change. A launch() that
  // throws leaves nothing in flight.
  void launch(const std::vector<BatchRow>& batch, const float* input = nullptr);
  const StepOutput& finish();

  // Convenience for one sequence: feeds `tokens` in chunks of n_batch; returns the logits of every
  // token ([tokens x n_vocab]) when all_logits, else of the last token only.
  std::vector<float> eval(int seq, std::span<const int32_t> tokens, bool all_logits = false);

  // Convenience for one sequence: feeds `tokens` in chunks of n_batch and returns every token's final
  // hidden state after the output norm ([tokens x n_embd]), what embeddings pool.
  std::vector<float> eval_hidden(int seq, std::span<const int32_t> tokens);

  // A new sequence continuing `seq`'s cached tokens: full KV blocks are shared (reference-counted),
  // the partial last block and the recurrent state are copied on every backend.
  int fork_sequence(int seq) { return memory_->fork_sequence(seq); }

  // Observes the input rows of every matrix product (importance matrices); nullptr to stop.
  void set_matmul_observer(Backend::MatmulObserver observer);

  // The key counts (a decode row's position + 1), ascending, up to options().n_ctx, at which some backend's
  // decode steps start to take a new captured form (Backend::decode_graph_depths: a CUDA graph keyed
  // by the attention's grid): the serve warm-up steps a row at each, so that requests find them captured.
  // Empty where nothing is captured (the CPU).
  std::vector<int> decode_graph_depths() const;
  // The row counts, ascending, whose decode steps (one row per sequence) take captured forms of their own; a step
  // of another count runs padded to the next (Backend::decode_graph_rows). Empty where nothing is captured.
  std::vector<int> decode_graph_rows() const;
  size_t captured_graphs() const;  // the backends' captured forms now (CUDA graphs)

  // Units (of n_layer + 1) placed on the GPU: 0 = CPU only.
  int gpu_units() const { return gpu_units_; }

  // The backends in layer order with what each holds (name as the report prints it, e.g. "CUDA0").
  struct PlacedRange {
    std::string backend;
    LayerSet layers;
    bool gpu = false;
  };
  std::vector<PlacedRange> placements() const;

  // The KV geometry the backends were given (memory_plan.h's planned_kv_config).
  const KvConfig& kv_config() const { return kv_; }

  // Human-readable placement and memory report (one line per item), as the startup log prints it.
  std::vector<std::string> report() const;
  // The f16 copies of EngineOptions::f16_copies, from the memory left on each GPU; create() makes them last
  // unless options().defer_f16_copies, for a caller that loads another engine first (a draft: the copies would
  // leave it no room). Returns the report's new lines; later calls do nothing.
  std::vector<std::string> keep_f16_copies();

 private:
  Engine() = default;

  std::shared_ptr<const Model> model_;
  EngineOptions options_;
  class BackendCopies;  // SequenceMemory::Device over the backends
  std::unique_ptr<BackendCopies> copies_;
  std::unique_ptr<SequenceMemory> memory_;
  struct Placement {
    Backend* backend;
    LayerSet layers;
  };
  std::vector<std::unique_ptr<Backend>> backends_;
  std::vector<Placement> placement_;  // in layer order: the embedding holder first, the output holder last
  std::vector<float> hidden_;         // boundary buffer [n_tokens x n_embd]
  StepOutput step_out_;
  StepDesc step_desc_;                      // the step in flight (its vectors reused)
  std::vector<std::pair<int, int>> runs_;   // its (sequence, rows) in batch order
  std::vector<BatchRow> launched_;          // its rows (launch() / finish())
  bool in_step_ = false;
  // The forward step behind decode() and step(): start_step() validates, reserves KV blocks and runs
  // every backend up to the output; end_step() runs the output and commits: logits of the wanted rows
  // into `logits`, greedy tokens into `argmax` when given (else argmax_only is ignored), the final
  // hidden states of want_hidden rows into hidden_out_. Returns
  // whether the logits are packed (the rows whose argmax the output backend picked are left out).
  void start_step(const std::vector<BatchRow>& batch, bool allow_argmax, const float* input = nullptr);
  // With `view`, a backend that keeps the logits in host memory of its own (Backend::keeps_host_logits) is
  // not copied from: *view points there and `logits` is left empty; otherwise *view is logits.data().
  bool end_step(std::vector<float>& logits, std::vector<int32_t>* argmax, const float** view = nullptr);
  std::vector<float> hidden_out_;  // the final hidden states of the last step's want_hidden rows
  std::vector<std::string> report_;   // startup lines about devices and placement
  bool f16_copies_kept_ = false;
  // -sm row: cuts the model into a slice per GPU of gpu_list (in proportion to weights), fits the units
  // every GPU can hold its slice of (budgets: bytes per GPU), makes row_split_ of the GPUs' backends
  // (moved from gpus) and returns the number of units offloaded.
  int place_row_split(std::vector<std::unique_ptr<Backend>>& gpus, const std::vector<int>& gpu_list, const std::vector<double>& weights,
                      const std::vector<double>& budgets, const KvConfig& kv, int n_cells, double work_bytes);
  std::unique_ptr<Backend> row_split_;  // until it is placed
  int gpu_units_ = 0;
  KvConfig kv_;  // the KV geometry every backend was given
};

}  // namespace roofline
