// The API layer's view of the tiny Qwen3-shaped synthetic model (a byte-level tokenizer plus the
// ChatML specials, and its chat template), for tests and fuzz targets that parse and render requests
// without running a model. Callers set what their server would (n_ctx, slots, sampling defaults).
#pragma once

#include <memory>

#include "model/model_file.h"
#include "serve/api.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace roofline::serve {

inline void describe_tiny_qwen3(ModelContext& mc) {
  ModelFileOptions o;
  o.layout_only = true;
  auto file = open_model_file("synthetic:tiny-qwen3:F32", o);
  mc.tokenizer = Tokenizer::from_metadata(file->metadata());
  mc.chat_template_source = chat_template_from_metadata(file->metadata());
  mc.chat_template = std::make_unique<ChatTemplate>(mc.chat_template_source);
  mc.model_id = "tiny";
  mc.n_vocab = mc.tokenizer->n_vocab();
}

// A context with the tiny model's tokenizer and template and a 2048-token window.
inline std::unique_ptr<ModelContext> tiny_qwen3_context() {
  auto mc = std::make_unique<ModelContext>();
  describe_tiny_qwen3(*mc);
  mc->n_ctx = 2048;
  return mc;
}

}  // namespace roofline::serve
