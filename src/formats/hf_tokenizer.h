// Hugging Face tokenizer files (tokenizer.json + tokenizer_config.json) turned into GGUF tokenizer
// metadata (tokenizer.ggml.* keys and tokenizer.chat_template) the way llama.cpp's converter writes
// them, so roofline's converter, synthetic models and llama.cpp all see the same vocabulary.
#pragma once

#include <string>

#include "formats/gguf_metadata.h"

namespace roofline {

// Adds the tokenizer keys for `tokenizer_json_path` (tokenizer_config.json is looked for beside it)
// to `metadata`. n_vocab > 0 pads the token list to that size with [PAD<id>] tokens (the model's
// embedding rows); a tokenizer larger than n_vocab is an error. `pre_override` replaces the detected
// tokenizer.ggml.pre name. Throws Error for unknown pre-tokenizer patterns, naming the pattern.
void add_hf_tokenizer_metadata(gguf::Metadata& metadata, const std::string& tokenizer_json_path, int n_vocab = 0,
                               const std::string& pre_override = "");

}  // namespace roofline
