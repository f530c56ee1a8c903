// open_model_file: dispatches between the GGUF reader and the synthetic model builder.
#include "model/model_file.h"

#include "model/synthetic.h"

namespace roofline {

std::shared_ptr<gguf::GgufFile> open_model_file(const std::string& spec, const ModelFileOptions& options) {
  if (is_synthetic_spec(spec)) {
    SyntheticSpec s = parse_synthetic_spec(spec);
    s.tokenizer_path = options.tokenizer_path;
    if (options.layout_only) {
      SyntheticLayout layout = synthetic_layout(s);
      return gguf::GgufFile::from_parts(spec, std::move(layout.metadata), std::move(layout.tensors), nullptr);
    }
    return build_synthetic_model(s, options.n_threads);
  }
  return gguf::GgufFile::open(spec);
}

}  // namespace roofline
