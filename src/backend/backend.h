// The backend interface: a backend holds some of a model's layers (and optionally the token
// embedding and the output unit), owns its weights in whatever layout its kernels read best, owns
// the per-sequence memory of its layers (KV blocks of attention layers, recurrent-state cells of
// DeltaNet layers), and runs whole layer ranges of a step. The engine moves the hidden
// state between backends once per placement boundary, as host floats [n_tokens x n_embd].
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

#include "backend/step.h"
#include "model/model.h"

namespace roofline {

struct LayerSet {
  int begin = 0, end = 0;   // transformer layers [begin, end)
  bool embedding = false;   // holds token_embd (the input unit)
  bool output = false;      // holds output_norm + output (the output unit)
  int n_layers() const { return end - begin; }
};

// f16 copies of a GPU's weight matrices for prompt steps (--f16-copies): none; those that fit in the memory
// left after the weights, KV cache, work buffers and margin (auto); all of them, or a one-line error (on).
enum class F16Copies { Off, Auto, On };

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // Memory plan, before loading: bytes of weights for these layers in this backend's layout, and
  // bytes of one KV block across these layers.
  virtual uint64_t weight_bytes(const Model& model, const LayerSet& layers) const = 0;
  virtual uint64_t kv_block_bytes(const Model& model, const LayerSet& layers, const KvConfig& kv) const = 0;

  // Bytes of one sequence's recurrent state across these layers (0 when none is a DeltaNet layer).
  virtual uint64_t state_cell_bytes(const Model& model, const LayerSet& layers) const = 0;
  // Bytes of one sequence's sliding-window rings across these layers (kv.swa_ring positions per sliding
  // layer; those layers then have no paged blocks). 0 for backends that keep sliding layers in blocks.
  virtual uint64_t swa_cell_bytes(const Model& model, const LayerSet& layers, const KvConfig& kv) const {
    (void)model, (void)layers, (void)kv;
    return 0;
  }

  // Bytes of one window snapshot across these layers (kv.swa_snapshot_blocks blocks per sliding layer, kept
  // in host memory whatever the backend), 0 without rings.
  virtual uint64_t swa_snapshot_bytes(const Model& model, const LayerSet& layers, const KvConfig& kv) const = 0;

  virtual void load(std::shared_ptr<const Model> model, const LayerSet& layers) = 0;
  virtual void init_kv(const KvConfig& kv) = 0;
  // Recurrent-state cells for the DeltaNet layers it holds (a no-op without such layers).
  virtual void init_state(int n_cells) = 0;

  // One step: begin_step, then embed or set_hidden, forward over layer ranges, then get_hidden or output
  // (and output_hidden).
  virtual void begin_step(const StepDesc& step) = 0;
  virtual void embed() = 0;
  virtual void set_hidden(const float* hidden) = 0;
  virtual void get_hidden(float* hidden) = 0;
  virtual void forward(int layer_begin, int layer_end) = 0;
  // Waits until the work launched so far has finished (forward() may only enqueue it on a GPU; output()
  // and get_hidden() wait by themselves). Tensor parallelism calls it on the slices that give no output.
  virtual void finish_step() {}
  // Final norm and output matrix for the step's logit rows: [logit_rows.size() x n_vocab].
  virtual void output(float* logits) = 0;
  // Final norm only, for the step's hidden rows (embeddings): [hidden_rows.size() x n_embd]. Called
  // after forward() and before or after output(), which it leaves as it was.
  virtual void output_hidden(float* hidden) = 0;
  // Greedy sampling where the logits are (optional; backends that offer it return true here). Like
  // output(), but for logit row i with step.argmax_only[i] set it writes only tokens[i], the row's
  // argmax as argmax_logits() (engine/sampler.h) picks it: the lowest id among the largest logits,
  // NaNs never picked unless the first one is. The other rows get tokens[i] = -1 and their logits,
  // packed in row order, in `logits` ([rows without argmax_only x n_vocab]).
  virtual bool supports_output_argmax() const { return false; }
  virtual void output_argmax(float* logits, int32_t* tokens) {
    (void)logits, (void)tokens;
    throw std::logic_error("this backend does not pick greedy tokens itself");
  }
  // Backends whose logits land in host memory of their own (a GPU's pinned staging buffer) can hand that
  // memory out instead of copying it: output() and output_argmax() then accept logits == nullptr, and
  // host_logits() is where the rows are (as those calls would have written them), valid until the
  // backend's next output. At 64 rows of a 152k vocabulary that copy is 39 MB a step.
  virtual bool keeps_host_logits() const { return false; }
  virtual const float* host_logits() const { return nullptr; }

  // Importance matrices: when set, called with the input rows of every matrix product of the held
  // layers and output (the activations a weight is multiplied with). `expert` is -1 for a plain
  // product; for a MoE layer's stacked experts, `weight` is the whole [in, out, n_expert] tensor and
  // the rows are those routed to expert `expert`. Backends that cannot observe throw Error.
  using MatmulObserver =
      std::function<void(const gguf::TensorInfo& weight, const float* x, int n_rows, int64_t n_cols, int expert)>;
  virtual void set_matmul_observer(MatmulObserver observer) = 0;

  // Tensor parallelism (-sm row): a backend loaded with a slice of the model (Model::tensor_slice: some of
  // each layer's heads and FFN features) gets partial sums from its attention output and down products.
  // With a hook set, it calls the hook with each such partial [n_tokens x n_embd] before the residual add
  // (and before any post-norm), and the hook leaves the sum over every slice in `data`. On the CPU `data`
  // is host memory and `stream` null; on a GPU `data` is device memory and `stream` the backend's
  // cudaStream_t, and the sum must be in `data` in that stream's order (the call only enqueues it).
  using PartialSum = std::function<void(float* data, size_t count, void* stream)>;
  virtual bool supports_partial_sum() const { return false; }
  virtual void set_partial_sum(PartialSum hook) {
    (void)hook;
    throw std::logic_error("this backend cannot run a slice of a tensor-parallel model");
  }

  // Copies one KV block (every layer this backend holds) to another, for forking a sequence.
  virtual void copy_kv_block(int src, int dst) = 0;
  // Copies one state cell (every DeltaNet layer's state and sliding layer's ring it holds) to another:
  // forks and snapshots.
  // Ordered after the steps already launched, before later ones.
  virtual void copy_state(int src, int dst) = 0;

  // Sliding-window rings' prompt-cache snapshots (after init_kv and init_state): host memory for n of them
  // (kv.swa_snapshot_blocks blocks per sliding layer each); save_window copies blocks [first_block,
  // first_block + n_blocks) of the sequence in state cell `cell` (its ring holds them) into snapshot
  // `snapshot`, load_window copies them back into another cell's ring. No-ops without ring layers.
  // Ordered after the steps already launched, before later ones; the host copy is complete on return.
  virtual void init_snapshots(int n) = 0;
  virtual void save_window(int cell, int first_block, int n_blocks, int snapshot) = 0;
  virtual void load_window(int snapshot, int cell, int first_block, int n_blocks) = 0;

  // Last, after every backend's init_snapshots: a GPU backend may keep f16 copies of its weight matrices
  // (F16Copies) for its prompt steps, which then multiply them instead of dequantizing every matrix in
  // every step. Returns a line for the startup report, or "" where it keeps none.
  virtual std::string keep_f16_copies() { return {}; }

  // The key counts (a decode row's position + 1), ascending, from 1 up to max_keys, at which this backend's
  // decode steps of some count of decode_graph_rows start to take a new captured form (the CUDA backend's graphs
  // are keyed by the attention's grid, which grows with the deepest row's keys): a warm-up that steps each of those
  // counts at each of them has every such form captured before the first request. Empty: a backend that captures
  // nothing.
  virtual std::vector<int> decode_graph_depths(int max_keys) const {
    (void)max_keys;
    return {};
  }
  // The row counts of decode steps (one row per sequence) that take captured forms of their own: a step of any other
  // count up to the largest runs padded to the next of them (CUDA: 1, 2, 4, 8, then 16, 32, 48, 64). Empty: none.
  virtual std::vector<int> decode_graph_rows() const { return {}; }
  virtual size_t captured_graphs() const { return 0; }  // the captured forms it holds now
};

}  // namespace roofline
