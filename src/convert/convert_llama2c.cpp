// llama2.c "version 0" checkpoint + tok.bin -> GGUF `llama`. The checkpoint's Q/K rows are already in
// the adjacent-pair RoPE layout GGUF llama uses, so nothing is permuted. Default output type F32 (lossless).
#include <cstring>
#include <filesystem>

#include "convert/convert.h"
#include "core/error.h"
#include "formats/llama2c.h"
#include "tokenizer/llama2c_vocab.h"

namespace roofline::convert {

ConvertResult convert_llama2c(const ConvertOptions& options) {
  namespace fs = std::filesystem;
  const auto ck = llama2c::Checkpoint::open(options.source);
  const llama2c::Config& c = ck->config();
  if (options.tokenizer.empty())
    fail("{}: a llama2.c checkpoint needs its tokenizer: --tokenizer tok.bin", options.source);
  if (!options.pre.empty()) fail("--pre applies to Hugging Face tokenizers, not to llama2.c's tok.bin");
  const std::optional<DType> requested = parse_outtype(options.outtype);
  const DType outtype = requested ? *requested : DType::F32;

  ConvertResult result;
  result.arch = "llama";
  result.outtype = dtype_name(outtype);

  gguf::Metadata md;
  const std::string a = "llama";
  md.set("general.architecture", gguf::Value::string(a));
  md.set("general.type", gguf::Value::string("model"));
  md.set("general.name", gguf::Value::string(fs::path(options.source).stem().string()));
  md.set(a + ".block_count", gguf::Value::u32((uint32_t)c.n_layers));
  md.set(a + ".context_length", gguf::Value::u32((uint32_t)c.seq_len));
  md.set(a + ".embedding_length", gguf::Value::u32((uint32_t)c.dim));
  md.set(a + ".feed_forward_length", gguf::Value::u32((uint32_t)c.hidden_dim));
  md.set(a + ".attention.head_count", gguf::Value::u32((uint32_t)c.n_heads));
  md.set(a + ".attention.head_count_kv", gguf::Value::u32((uint32_t)c.n_kv_heads));
  md.set(a + ".rope.freq_base", gguf::Value::f32(10000.0f));
  md.set(a + ".attention.layer_norm_rms_epsilon", gguf::Value::f32(1e-5f));
  md.set("general.file_type", gguf::Value::u32(file_type_for(outtype)));
  md.set(a + ".vocab_size", gguf::Value::u32((uint32_t)c.vocab_size));
  md.set(a + ".rope.dimension_count", gguf::Value::u32((uint32_t)c.head_size()));
  md.set("general.quantization_version", gguf::Value::u32(2));
  add_llama2c_tokenizer_metadata(md, options.tokenizer, c.vocab_size);

  std::vector<PlannedTensor> planned;
  auto plan = [&](const std::string& name, const llama2c::Array& arr) {
    std::vector<int64_t> shape(arr.shape.rbegin(), arr.shape.rend());
    std::string note;
    const DType type = tensor_type_for(name, (int)shape.size(), shape[0], outtype, &note);
    if (!note.empty()) result.notes.push_back(note);
    const int64_t row = shape[0];
    planned.push_back({name, shape, type, [arr, row](float* dst, int64_t r0, int64_t nr) {
                         std::memcpy(dst, arr.data + r0 * row * 4, (size_t)(nr * row) * sizeof(float));
                       }});
  };
  plan("token_embd.weight", ck->tok_embeddings());
  const std::pair<const char*, const char*> per_layer[] = {
      {"rms_att", "attn_norm"}, {"wq", "attn_q"},     {"wk", "attn_k"},     {"wv", "attn_v"},    {"wo", "attn_output"},
      {"rms_ffn", "ffn_norm"},  {"w1", "ffn_gate"},   {"w3", "ffn_up"},     {"w2", "ffn_down"},
  };
  for (int il = 0; il < c.n_layers; ++il)
    for (const auto& [kind, gguf_name] : per_layer)
      plan(fmt::format("blk.{}.{}.weight", il, gguf_name), ck->layer(kind, il));
  plan("output_norm.weight", ck->rms_final());
  if (!c.shared_classifier) plan("output.weight", ck->classifier());

  write_converted(options, md, planned, result);
  return result;
}

}  // namespace roofline::convert
