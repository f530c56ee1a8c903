// A loaded model: hyperparameters read from GGUF metadata and every weight bound by name and checked
// for shape, as the architecture's tensor table (arch.h) says. Weights are views into the GgufFile (mmap or memory); backends copy or repack what they
// hold. Shapes are GGUF order: ne[0] is the row length (the input dimension of a matrix).
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "formats/gguf.h"
#include "model/arch.h"

namespace roofline {

// A weight: a view of one GGUF tensor (nullptr data only for layout-only synthetic models).
struct Weight {
  const gguf::TensorInfo* tensor = nullptr;
  explicit operator bool() const { return tensor != nullptr; }
  DType type() const { return tensor->type; }
  int64_t cols() const { return tensor->ne[0]; }  // row length / input dimension
  int64_t rows() const { return tensor->ne[1]; }  // output dimension
  const uint8_t* data() const { return tensor->data; }
  size_t bytes() const { return tensor->n_bytes; }
};

// A layer's tensors by role (LayerTensor; absent ones are empty), and its kind.
struct LayerWeights {
  MixerKind mixer = MixerKind::Attention;
  std::array<Weight, kLayerTensorCount> tensors;
  const Weight& operator[](LayerTensor t) const { return tensors[(size_t)t]; }
  Weight& operator[](LayerTensor t) { return tensors[(size_t)t]; }
};

class Model {
 public:
  // Binds and checks everything; throws one Error listing every missing, unexpected or mis-shaped tensor.
  static std::shared_ptr<const Model> load(std::shared_ptr<const gguf::GgufFile> file);

  const gguf::GgufFile& file() const { return *file_; }
  std::shared_ptr<const gguf::GgufFile> file_ptr() const { return file_; }
  const gguf::Metadata& metadata() const { return file_->metadata(); }
  const ArchInfo& arch() const { return *arch_; }
  const HParams& hparams() const { return hparams_; }

  const Weight& token_embd() const { return token_embd_; }
  const Weight& output_norm() const { return output_norm_; }
  const Weight& output() const { return output_; }  // token_embd when embeddings are tied
  bool tied_embeddings() const { return tied_; }
  const Weight& rope_freqs() const { return rope_freqs_; }  // llama3 factors (divisors), optional
  const LayerWeights& layer(int i) const { return layers_[i]; }

  // MTP blocks stored after the main stack (hp.n_layer_nextn): their tensors, bound but not run here
  // (the MTP drafter runs the first one: mtp_block).
  const std::vector<Weight>& nextn_tensors() const { return nextn_; }
  // A nextn tensor by its name after "blk.<n_layer>." (e.g. "nextn.eh_proj.weight"); empty if absent.
  Weight nextn_tensor(const std::string& suffix) const;

  // The first MTP block of `target` as a model of its own, sharing the target's file: one full-attention
  // layer (blk.<n_layer>'s attention and FFN tensors, checked against the architecture's table), the
  // target's token embedding and output matrix, and nextn.shared_head_norm as its output norm. What
  // comes before the layer (eh_proj over the normed embedding and hidden state) is the drafter's.
  // Error (one line) when the file has no MTP block or it is incomplete.
  static std::shared_ptr<const Model> mtp_block(const std::shared_ptr<const Model>& target);

  // The part of `target` one GPU runs under -sm row (engine/tensor_split.h): the same layers with KV heads
  // [kv_head_begin, kv_head_end) and their query heads, and FFN features [ff_begin, ff_end): rows of q, k
  // and v (and their biases), of gate and up, and columns of the attention output and down matrices
  // (copied: a column range is not contiguous). Norms, embedding and output are the target's. Dense
  // attention models only; column bounds must be whole blocks of the sliced matrices' types (the ranges
  // plan_tensor_split gives are). One-line Error otherwise.
  static std::shared_ptr<const Model> tensor_slice(const std::shared_ptr<const Model>& target, int kv_head_begin, int kv_head_end,
                                                   int64_t ff_begin, int64_t ff_end);

  // Bytes of the weights of layer i (all its tensors) and of the output unit (norm + output matrix).
  uint64_t layer_bytes(int i) const;
  uint64_t output_bytes() const;
  uint64_t n_params() const;
  std::string description() const;  // "qwen3 1.7B Q4_K - Medium" in llama.cpp's style

 private:
  std::shared_ptr<const gguf::GgufFile> file_;
  const ArchInfo* arch_ = nullptr;
  HParams hparams_;
  Weight token_embd_, output_norm_, output_, rope_freqs_;
  bool tied_ = false;
  std::vector<LayerWeights> layers_;
  std::vector<Weight> nextn_;
  // tensor_slice's own tensors (views of the target's rows, or copied column ranges).
  std::vector<std::unique_ptr<gguf::TensorInfo>> owned_infos_;
  std::vector<std::vector<uint8_t>> owned_bytes_;
  std::shared_ptr<const Model> parent_;  // a slice's target
};

// Fails with one line when -sm row cannot split a model of these hyperparameters at all: MoE, DeltaNet or
// gated-attention layers (plan_tensor_split and Model::tensor_slice both ask).
void require_tensor_splittable(const HParams& hp);

// Columns [col_begin, col_end) of `rows` rows of `cols` values of `type`, stored row after row (GGUF
// layout), as rows of (col_end - col_begin) values in the same type: each row's byte range copied. The
// bounds must be multiples of the type's block size.
std::vector<uint8_t> slice_columns(const uint8_t* data, DType type, int64_t rows, int64_t cols, int64_t col_begin, int64_t col_end);

}  // namespace roofline
