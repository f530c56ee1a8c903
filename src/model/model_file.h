// Opening a model by what the user typed after -m: a GGUF path or a synthetic:SHAPE:MIX spec.
#pragma once

#include <memory>
#include <string>

#include "formats/gguf.h"

namespace roofline {

struct ModelFileOptions {
  std::string tokenizer_path;  // for synthetic models: tokenizer.json or GGUF vocab to carry
  int n_threads = 0;           // for building synthetic models (0: all cores)
  bool layout_only = false;    // synthetic: metadata and tensor table only, tensor data pointers null
};

std::shared_ptr<gguf::GgufFile> open_model_file(const std::string& spec, const ModelFileOptions& options = {});

}  // namespace roofline
