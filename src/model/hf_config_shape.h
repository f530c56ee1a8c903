// A Hugging Face config.json read as a ModelShape (model_shapes.h), so a model that has not been
// downloaded or converted can be laid out as the converter and the quantizer would write it (the
// synthetic layout) and planned without weights. Covers what `roofline convert` converts: llama,
// qwen2, qwen3 and qwen3_5 (Qwen3.5, text_config).
#pragma once

#include <string>

#include "model/model_shapes.h"

namespace roofline {

// Reads `path` (a config.json, or a folder holding one). Error (one line, naming the file and key)
// when it cannot be read, is not JSON, lacks a key or names an architecture not supported.
ModelShape shape_from_hf_config(const std::string& path);

}  // namespace roofline
