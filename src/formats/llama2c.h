// llama2.c checkpoints, legacy "version 0" format: 7 int32 header values, then float32 arrays in a
// fixed order (token embedding, per-layer weights grouped by kind, final norm, RoPE tables, optional
// classifier). A negative vocab_size means a separate classifier follows. Validated against the file size.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/mapped_file.h"

namespace roofline::llama2c {

struct Config {
  int dim = 0;
  int hidden_dim = 0;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int vocab_size = 0;  // always positive here
  int seq_len = 0;
  bool shared_classifier = true;  // header vocab_size > 0

  int head_size() const { return dim / n_heads; }
  int kv_dim() const { return head_size() * n_kv_heads; }
};

// One float32 array of the checkpoint, in PyTorch order (a matrix is [out, in]).
struct Array {
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // little-endian float32, 4-byte aligned within the file
  int64_t n_elements() const;
  const float* floats() const { return reinterpret_cast<const float*>(data); }
};

class Checkpoint {
 public:
  // Throws Error("PATH: problem") for a bad header, a newer llama2.c format, or a size mismatch.
  static std::shared_ptr<Checkpoint> open(const std::string& path);

  const std::string& path() const { return path_; }
  const Config& config() const { return config_; }

  // Whole-model arrays.
  Array tok_embeddings() const;  // [vocab, dim]
  Array rms_final() const;       // [dim]
  Array classifier() const;      // [vocab, dim]: tok_embeddings when shared
  // Per-layer slices: kind is one of rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3.
  Array layer(const std::string& kind, int layer) const;

  // Expected file size for a header (bytes), or 0 when the sizes overflow.
  static uint64_t expected_size(const Config& config);

 private:
  std::string path_;
  std::unique_ptr<MappedFile> map_;
  Config config_;
  struct Section {
    std::string kind;
    std::vector<int64_t> per_layer_shape;  // shape of one layer's slice (or of the whole array)
    bool per_layer;
    uint64_t offset;  // bytes from the start of the file
  };
  std::vector<Section> sections_;
  const Section& section(const std::string& kind) const;
};

}  // namespace roofline::llama2c
