// Synthetic models: a known shape (model_shapes.h) with a quant mix (quant_mix.h) and random weights,
// deterministic per seed, built in memory or written to a GGUF file. The spec "synthetic:SHAPE:MIX[:SEED]"
// works wherever a model path does, so a 32B model can be benchmarked without downloading it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/thread_pool.h"
#include "formats/gguf.h"
#include "model/model_shapes.h"
#include "model/quant_mix.h"

namespace roofline {

struct SyntheticSpec {
  ModelShape shape;
  const QuantMix* mix = nullptr;
  uint64_t seed = 1;
  std::string tokenizer_path;  // tokenizer.json or a GGUF vocab; empty: a byte-level vocabulary
};

bool is_synthetic_spec(const std::string& spec);
// Parses "synthetic:SHAPE:MIX[:SEED]"; throws Error listing the known shapes/mixes when wrong.
SyntheticSpec parse_synthetic_spec(const std::string& spec);

// Metadata and tensor infos (without data) in file order.
struct SyntheticLayout {
  gguf::Metadata metadata;
  std::vector<gguf::TensorInfo> tensors;
};
SyntheticLayout synthetic_layout(const SyntheticSpec& spec);

// Fills one tensor's bytes (tensor.n_bytes at dst) with its deterministic random content, in parallel
// over the pool (the content does not depend on the thread count).
void fill_synthetic_tensor(const SyntheticSpec& spec, const gguf::TensorInfo& tensor, uint8_t* dst, ThreadPool& pool);

std::shared_ptr<gguf::GgufFile> build_synthetic_model(const SyntheticSpec& spec, int n_threads = 0);
void write_synthetic_model(const SyntheticSpec& spec, const std::string& path, int n_threads = 0);

// The byte-level vocabulary used when no tokenizer is given: 256 byte tokens (GPT-2 byte mapping),
// <|endoftext|>, <|im_start|>, <|im_end|>, then unused tokens up to n_vocab; a ChatML template.
void add_byte_level_tokenizer(gguf::Metadata& metadata, int n_vocab);

// llama3-style rope scaling factors (the rope_freqs tensor, n_rot/2 values).
std::vector<float> llama3_rope_factors(int n_rot, float freq_base, float factor, float low_freq_factor,
                                       float high_freq_factor, int original_context);

}  // namespace roofline
