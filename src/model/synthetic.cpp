// Synthetic model builder: tensor layout from the shape table and mix rules, then random content
// generated block-wise and in parallel. Quantized tensors are made directly as random blocks with
// scales chosen so weights have a std of about 0.02 (the values never need to be quantized).
#include "model/synthetic.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "core/fp16.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "formats/hf_tokenizer.h"
#include "formats/quant_blocks.h"
#include "model/arch.h"

namespace roofline {

namespace {

constexpr const char* kPrefix = "synthetic:";
constexpr size_t kChunkBytes = 1 << 16;  // generation unit: content depends on chunk index only

std::string known_shapes() {
  std::string s;
  for (const ModelShape& m : model_shapes()) s += (s.empty() ? "" : ", ") + m.name;
  return s;
}
std::string known_mixes() {
  std::string s;
  for (const char* m : {"F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q4_K_M", "Q4_K_S", "Q3_K_L", "Q3_K_M",
                        "Q3_K_S", "Q2_K", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "IQ4_XS"})
    s += (s.empty() ? "" : ", ") + std::string(m);
  return s;
}

}  // namespace

bool is_synthetic_spec(const std::string& spec) { return spec.rfind(kPrefix, 0) == 0; }

SyntheticSpec parse_synthetic_spec(const std::string& text) {
  std::string rest = is_synthetic_spec(text) ? text.substr(std::strlen(kPrefix)) : text;
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    const size_t colon = rest.find(':', start);
    parts.push_back(rest.substr(start, colon - start));
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  if (parts.size() < 2 || parts.size() > 3)
    fail("bad synthetic model '{}': expected synthetic:SHAPE:MIX[:SEED] (shapes: {}; mixes: {})", text, known_shapes(), known_mixes());
  SyntheticSpec spec;
  const ModelShape* shape = find_model_shape(parts[0]);
  if (!shape) fail("unknown synthetic shape '{}' (known: {})", parts[0], known_shapes());
  spec.shape = *shape;
  spec.mix = find_mix(parts[1]);
  if (!spec.mix) fail("unknown quantization mix '{}' (known: {})", parts[1], known_mixes());
  if (parts.size() == 3) {
    char* end = nullptr;
    spec.seed = std::strtoull(parts[2].c_str(), &end, 10);
    if (parts[2].empty() || *end) fail("bad seed '{}' in synthetic model '{}'", parts[2], text);
  }
  return spec;
}

std::vector<float> llama3_rope_factors(int n_rot, float freq_base, float factor, float low_freq_factor,
                                       float high_freq_factor, int original_context) {
  const double low_freq_wavelen = original_context / low_freq_factor;
  const double high_freq_wavelen = original_context / high_freq_factor;
  std::vector<float> factors;
  for (int i = 0; i < n_rot; i += 2) {
    const double freq = 1.0 / std::pow((double)freq_base, (double)i / n_rot);
    const double wavelen = 2 * M_PI / freq;
    if (wavelen < high_freq_wavelen) {
      factors.push_back(1.0f);
    } else if (wavelen > low_freq_wavelen) {
      factors.push_back(factor);
    } else {
      const double smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
      factors.push_back((float)(1.0 / ((1 - smooth) / factor + smooth)));
    }
  }
  return factors;
}

// GPT-2's reversible byte -> printable code point mapping, as UTF-8 strings.
static std::string byte_token(int b) {
  int cp;
  if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) {
    cp = b;
  } else {
    int n = 0;
    for (int x = 0; x < b; ++x)
      if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) ++n;
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += (char)cp;
  } else {
    s += (char)(0xC0 | (cp >> 6));
    s += (char)(0x80 | (cp & 0x3F));
  }
  return s;
}

void add_byte_level_tokenizer(gguf::Metadata& md, int n_vocab) {
  if (n_vocab < 259) fail("a byte-level vocabulary needs at least 259 tokens, the shape has {}", n_vocab);
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(byte_token(b));
    types.push_back(1);  // NORMAL
  }
  for (const char* special : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    tokens.push_back(special);
    types.push_back(3);  // CONTROL
  }
  while ((int)tokens.size() < n_vocab) {
    tokens.push_back(fmt::format("<|unused_{}|>", tokens.size()));
    types.push_back(5);  // UNUSED
  }
  md.set("tokenizer.ggml.model", gguf::Value::string("gpt2"));
  md.set("tokenizer.ggml.pre", gguf::Value::string("default"));
  md.set("tokenizer.ggml.tokens", gguf::Value::string_array(std::move(tokens)));
  md.set("tokenizer.ggml.token_type", gguf::Value::i32_array(types));
  md.set("tokenizer.ggml.merges", gguf::Value::string_array({}));
  md.set("tokenizer.ggml.bos_token_id", gguf::Value::u32(256));
  md.set("tokenizer.ggml.eos_token_id", gguf::Value::u32(258));
  md.set("tokenizer.ggml.padding_token_id", gguf::Value::u32(256));
  md.set("tokenizer.ggml.add_bos_token", gguf::Value::boolean(false));
  md.set("tokenizer.chat_template",
         gguf::Value::string("{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                             "'<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
                             "{%- endif %}"));
}

// Copies the tokenizer.* keys of a GGUF vocabulary, padding the token list to n_vocab as llama.cpp's
// converter does ([PAD<id>] tokens of type UNUSED).
static void add_gguf_tokenizer(gguf::Metadata& md, const std::string& path, int n_vocab) {
  auto vocab = gguf::GgufFile::open(path);
  size_t n_tokens = 0;
  for (const auto& [key, value] : vocab->metadata().entries()) {
    if (key.rfind("tokenizer.", 0) != 0) continue;
    md.set(key, value);
  }
  const gguf::Value* tokens = md.find("tokenizer.ggml.tokens");
  if (!tokens) fail("{}: has no tokenizer.ggml.tokens", path);
  std::vector<std::string> list = tokens->as_string_array("tokenizer.ggml.tokens");
  n_tokens = list.size();
  if ((int64_t)n_tokens > n_vocab) fail("{}: {} tokens do not fit the shape's vocabulary of {}", path, n_tokens, n_vocab);
  if ((int64_t)n_tokens < n_vocab) {
    std::vector<int64_t> types64;
    if (const gguf::Value* t = md.find("tokenizer.ggml.token_type")) types64 = t->as_int_array("tokenizer.ggml.token_type");
    types64.resize(n_tokens, 1);
    std::vector<int32_t> types(types64.begin(), types64.end());
    std::vector<float> scores;
    const gguf::Value* s = md.find("tokenizer.ggml.scores");
    if (s) scores = s->as_float_array("tokenizer.ggml.scores");
    for (size_t i = n_tokens; i < (size_t)n_vocab; ++i) {
      list.push_back(fmt::format("[PAD{}]", i));
      types.push_back(5);
      if (s) scores.push_back(0.0f);
    }
    md.set("tokenizer.ggml.tokens", gguf::Value::string_array(std::move(list)));
    md.set("tokenizer.ggml.token_type", gguf::Value::i32_array(types));
    if (s) md.set("tokenizer.ggml.scores", gguf::Value::f32_array(scores));
  }
}

SyntheticLayout synthetic_layout(const SyntheticSpec& spec) {
  const ModelShape& s = spec.shape;
  ROOFLINE_CHECK(spec.mix != nullptr);
  SyntheticLayout layout;
  gguf::Metadata& md = layout.metadata;
  const std::string a = s.arch;
  md.set("general.architecture", gguf::Value::string(a));
  md.set("general.type", gguf::Value::string("model"));
  md.set("general.name", gguf::Value::string(fmt::format("synthetic {} {} (random weights, seed {})", s.name, spec.mix->name, spec.seed)));
  md.set("general.file_type", gguf::Value::u32((uint32_t)spec.mix->file_type));
  md.set("general.quantization_version", gguf::Value::u32(2));
  md.set(a + ".context_length", gguf::Value::u32(s.n_ctx_train));
  md.set(a + ".embedding_length", gguf::Value::u32(s.n_embd));
  md.set(a + ".block_count", gguf::Value::u32(s.n_layer + s.n_mtp));  // MTP blocks count, as llama.cpp writes them
  md.set(a + ".feed_forward_length", gguf::Value::u32(s.n_ff));
  md.set(a + ".attention.head_count", gguf::Value::u32(s.n_head));
  md.set(a + ".attention.head_count_kv", gguf::Value::u32(s.n_head_kv));
  md.set(a + ".rope.freq_base", gguf::Value::f32(s.rope_freq_base));
  md.set(a + ".attention.layer_norm_rms_epsilon", gguf::Value::f32(s.rms_eps));
  md.set(a + ".attention.key_length", gguf::Value::u32(s.head_dim));
  md.set(a + ".attention.value_length", gguf::Value::u32(s.head_dim));
  if (a == "llama") {
    md.set(a + ".rope.dimension_count", gguf::Value::u32(s.head_dim));
    md.set(a + ".vocab_size", gguf::Value::u32(s.n_vocab));
  }
  if (s.n_rot > 0 && s.n_rot != s.head_dim) md.set(a + ".rope.dimension_count", gguf::Value::u32(s.n_rot));
  if (s.full_attention_interval > 0) {  // qwen35, as llama.cpp's converter writes it
    md.set(a + ".rope.dimension_sections", gguf::Value::i32_array({11, 11, 10, 0}));
    md.set(a + ".ssm.conv_kernel", gguf::Value::u32(s.ssm_conv_kernel));
    md.set(a + ".ssm.state_size", gguf::Value::u32(s.ssm_head_dim));
    md.set(a + ".ssm.group_count", gguf::Value::u32(s.ssm_n_k_heads));
    md.set(a + ".ssm.time_step_rank", gguf::Value::u32(s.ssm_n_v_heads));
    md.set(a + ".ssm.inner_size", gguf::Value::u32(s.ssm_head_dim * s.ssm_n_v_heads));
    md.set(a + ".full_attention_interval", gguf::Value::u32(s.full_attention_interval));
    if (s.n_mtp > 0) md.set(a + ".nextn_predict_layers", gguf::Value::u32(s.n_mtp));
  }
  if (s.n_expert > 0) {  // as llama.cpp's converter writes a qwen3moe / qwen35moe config
    md.set(a + ".expert_count", gguf::Value::u32(s.n_expert));
    md.set(a + ".expert_used_count", gguf::Value::u32(s.n_expert_used));
    md.set(a + ".expert_feed_forward_length", gguf::Value::u32(s.n_ff_exp));
    if (s.n_ff_shexp > 0) md.set(a + ".expert_shared_feed_forward_length", gguf::Value::u32(s.n_ff_shexp));
  }
  if (s.sliding_window > 0) {  // gemma3, as llama.cpp's converter writes it
    md.set(a + ".attention.sliding_window", gguf::Value::u32(s.sliding_window));
    md.set(a + ".rope.freq_base_swa", gguf::Value::f32(s.rope_freq_base_swa));
  }
  if (s.rope_linear_factor > 0) {
    md.set(a + ".rope.scaling.type", gguf::Value::string("linear"));
    md.set(a + ".rope.scaling.factor", gguf::Value::f32(s.rope_linear_factor));
  }
  if (spec.tokenizer_path.empty()) {
    add_byte_level_tokenizer(md, s.n_vocab);
  } else if (spec.tokenizer_path.size() > 5 && spec.tokenizer_path.substr(spec.tokenizer_path.size() - 5) == ".gguf") {
    add_gguf_tokenizer(md, spec.tokenizer_path, s.n_vocab);
  } else {
    add_hf_tokenizer_metadata(md, spec.tokenizer_path, s.n_vocab);
  }

  // Tensors in the order llama.cpp's converter writes them; source types as a converted f16 model has.
  struct Planned {
    std::string name;
    std::vector<int64_t> shape;
  };
  std::vector<Planned> planned;
  const ArchInfo* arch = find_arch(a);
  ROOFLINE_CHECK(arch != nullptr, "shape {} names an unknown architecture {}", s.name, a);
  const HParams hp = read_hparams(md, *arch);
  planned.push_back({"token_embd.weight", {s.n_embd, s.n_vocab}});
  if (s.rope_scaling_factor > 0) planned.push_back({"rope_freqs.weight", {s.head_dim / 2}});
  for (int il = 0; il < hp.n_layer; ++il) {
    for (const PlannedTensor& t : layer_tensor_plan(*arch, hp, il)) {
      if (!t.rule->required && !(s.qkv_bias && (t.rule->role == LayerTensor::AttnQBias || t.rule->role == LayerTensor::AttnKBias ||
                                                  t.rule->role == LayerTensor::AttnVBias)))
        continue;
      planned.push_back({t.name, t.shape});
    }
  }
  // MTP blocks (qwen35, as llama.cpp's converter writes them): a full-attention layer each, and after
  // the first the nextn fc over [embedding; hidden] and its norms.
  for (int i = 0; i < s.n_mtp; ++i) {
    HParams mhp = hp;
    mhp.layer_mixer.assign((size_t)(hp.n_layer + i + 1), MixerKind::Attention);
    for (const PlannedTensor& t : layer_tensor_plan(*arch, mhp, hp.n_layer + i))
      if (t.rule->required) planned.push_back({t.name, t.shape});
  }
  if (s.n_mtp > 0) {
    const std::string nb = "blk." + std::to_string(hp.n_layer) + ".nextn.";
    planned.push_back({nb + "eh_proj.weight", {2 * (int64_t)s.n_embd, s.n_embd}});
    for (const char* norm : {"enorm", "hnorm", "shared_head_norm"}) planned.push_back({nb + norm + ".weight", {s.n_embd}});
  }
  planned.push_back({"output_norm.weight", {s.n_embd}});
  if (!s.tied_embeddings) planned.push_back({"output.weight", {s.n_embd, s.n_vocab}});

  // llama-quantize writes tensors ordered by layer (non-layer tensors first), then by name; follow it.
  auto layer_of = [](const std::string& n) {
    int layer = -1;
    return std::sscanf(n.c_str(), "blk.%d.", &layer) == 1 ? layer : -1;
  };
  std::stable_sort(planned.begin(), planned.end(), [&](const Planned& x, const Planned& y) {
    const int lx = layer_of(x.name), ly = layer_of(y.name);
    return lx != ly ? lx < ly : x.name < y.name;
  });
  std::vector<std::string> names;
  for (const Planned& p : planned) names.push_back(p.name);
  // The mix counts every block, MTP ones included (llama.cpp's n_layer is the block count).
  MixPlanner planner(*spec.mix, mix_model_info(s.arch, s.n_layer + s.n_mtp, s.n_head, s.n_head_kv, s.n_expert, names));
  for (const Planned& p : planned) {
    gguf::TensorInfo t;
    t.name = p.name;
    t.n_dims = (int)p.shape.size();
    for (size_t i = 0; i < p.shape.size(); ++i) t.ne[i] = p.shape[i];
    // Source types as llama.cpp's converter writes them: f32 for 1-D tensors, the conv taps and the
    // MoE routers (ffn_gate_inp, ffn_gate_inp_shexp).
    const bool f32_source = t.n_dims == 1 || t.name.find("ssm_conv1d") != std::string::npos ||
                            t.name.find("ffn_gate_inp") != std::string::npos;
    const DType source = f32_source ? DType::F32 : DType::F16;
    t.type = spec.mix->file_type == FileType::ALL_F32 ? DType::F32 : planner.type_for(t.name, source, t.ne, t.n_dims);
    if (source == DType::F32) t.type = DType::F32;
    t.n_bytes = gguf::tensor_bytes(t.type, t.ne);
    layout.tensors.push_back(std::move(t));
  }
  return layout;
}

namespace {

// Random weights of std ~0.02 (sum of four uniforms: close enough to a gaussian for a random model).
inline float random_weight(uint64_t r) {
  const float sum = (float)(r & 0xffff) + (float)((r >> 16) & 0xffff) + (float)((r >> 32) & 0xffff) + (float)(r >> 48);
  return (sum / 65536.0f - 2.0f) * (1.7320508f * 0.02f);
}

void put_f16(uint8_t* p, float v) {
  const uint16_t h = f32_to_fp16(v);
  std::memcpy(p, &h, 2);
}

// Scale so that a block's values have std ~0.02 (derived from each format's value formula).
struct QuantFix {
  size_t d_offset;
  float d;
  int dmin_offset;  // -1: none
  float dmin_over_d;
};

QuantFix quant_fix(DType t) {
  switch (t) {
    case DType::Q4_0: return {0, 0.02f / 4.6f, -1, 0};
    case DType::Q4_1: return {0, 0.02f / 4.6f, 2, -7.5f};
    case DType::Q5_0: return {0, 0.02f / 9.2f, -1, 0};
    case DType::Q5_1: return {0, 0.02f / 9.2f, 2, -15.5f};
    case DType::Q8_0: return {0, 0.02f / 73.0f, -1, 0};
    case DType::IQ4_NL: return {0, 0.02f / 68.0f, -1, 0};
    case DType::Q2_K: return {80, 0.02f / 9.0f, 82, 1.5f};
    case DType::Q3_K: return {108, 0.02f / 42.0f, -1, 0};
    case DType::Q4_K: return {0, 0.02f / 170.0f, 2, 7.5f};
    case DType::Q5_K: return {0, 0.02f / 340.0f, 2, 15.5f};
    case DType::Q6_K: return {208, 0.02f / 1370.0f, -1, 0};
    case DType::IQ4_XS: return {0, 0.02f / 1250.0f, -1, 0};
    default: fail("synthetic models cannot generate tensors of type {}", dtype_name(t));
  }
}

}  // namespace

void fill_synthetic_tensor(const SyntheticSpec& spec, const gguf::TensorInfo& t, uint8_t* dst, ThreadPool& pool) {
  const uint64_t tensor_seed = splitmix64(spec.seed ^ hash_string(t.name));
  const std::string& name = t.name;

  if (name == "rope_freqs.weight") {
    const ModelShape& s = spec.shape;
    const auto f = llama3_rope_factors(s.head_dim, s.rope_freq_base, s.rope_scaling_factor, s.rope_low_freq_factor,
                                       s.rope_high_freq_factor, s.rope_original_context);
    ROOFLINE_CHECK(f.size() * 4 == t.n_bytes);
    std::memcpy(dst, f.data(), t.n_bytes);
    return;
  }
  if (t.n_dims == 1) {  // norms are ~1, biases ~0, DeltaNet decays ssm_a = -exp(A_log) in [-2, -0.2]
    const bool is_norm = name.find("norm") != std::string::npos;
    const bool is_decay = name.size() >= 5 && name.compare(name.size() - 5, 5, "ssm_a") == 0;
    Rng rng(tensor_seed);
    float* out = reinterpret_cast<float*>(dst);
    for (int64_t i = 0; i < t.ne[0]; ++i)
      out[i] = is_decay ? -(0.2f + 1.8f * (float)rng.uniform()) : (is_norm ? 1.0f : 0.0f) + (float)(rng.uniform() - 0.5) * 0.02f;
    return;
  }

  const DTypeTraits& traits = dtype_traits(t.type);
  const size_t chunk = kChunkBytes / traits.block_bytes * traits.block_bytes;  // whole blocks per chunk
  const size_t n_chunks = (t.n_bytes + chunk - 1) / chunk;
  QuantFix fix{};
  if (traits.quantized) fix = quant_fix(t.type);

  pool.parallel_for(n_chunks, [&](size_t c) {
    uint8_t* p = dst + c * chunk;
    const size_t len = std::min(chunk, t.n_bytes - c * chunk);
    uint64_t state = splitmix64(tensor_seed + c * 0x9e3779b97f4a7c15ull);
    auto next = [&] {
      state += 0x9e3779b97f4a7c15ull;
      uint64_t z = state;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      return z ^ (z >> 31);
    };
    if (t.type == DType::F32) {
      float* f = reinterpret_cast<float*>(p);
      for (size_t i = 0; i < len / 4; ++i) f[i] = random_weight(next());
    } else if (t.type == DType::F16 || t.type == DType::BF16) {
      const bool bf = t.type == DType::BF16;
      for (size_t i = 0; i < len / 2; ++i) {
        const float v = random_weight(next());
        const uint16_t h = bf ? f32_to_bf16(v) : f32_to_fp16(v);
        std::memcpy(p + 2 * i, &h, 2);
      }
    } else {
      size_t i = 0;
      for (; i + 8 <= len; i += 8) {
        const uint64_t r = next();
        std::memcpy(p + i, &r, 8);
      }
      for (uint64_t r = next(); i < len; ++i, r >>= 8) p[i] = (uint8_t)r;
      for (size_t b = 0; b < len; b += traits.block_bytes) {
        const float jitter = 0.75f + 0.5f * (float)(next() >> 40) / (float)(1 << 24);
        const float d = fix.d * jitter;
        put_f16(p + b + fix.d_offset, d);
        if (fix.dmin_offset >= 0) put_f16(p + b + fix.dmin_offset, d * fix.dmin_over_d);
      }
    }
  });
}

namespace {

struct AnonymousMemory {
  void* data = nullptr;
  size_t size = 0;
  explicit AnonymousMemory(size_t n) : size(n) {
    if (n == 0) return;
    data = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (data == MAP_FAILED) {
      data = nullptr;
      fail("cannot allocate {:.1f} GiB for a synthetic model", n / 1073741824.0);
    }
  }
  ~AnonymousMemory() {
    if (data) ::munmap(data, size);
  }
};

}  // namespace

std::shared_ptr<gguf::GgufFile> build_synthetic_model(const SyntheticSpec& spec, int n_threads) {
  SyntheticLayout layout = synthetic_layout(spec);
  const uint32_t alignment = gguf::kDefaultAlignment;
  size_t total = 0;
  for (auto& t : layout.tensors) total += (t.n_bytes + alignment - 1) / alignment * alignment;
  auto memory = std::make_shared<AnonymousMemory>(total);
  uint8_t* base = static_cast<uint8_t*>(memory->data);
  size_t offset = 0;
  ThreadPool pool(n_threads);
  for (auto& t : layout.tensors) {
    t.data = base + offset;
    fill_synthetic_tensor(spec, t, base + offset, pool);
    offset += (t.n_bytes + alignment - 1) / alignment * alignment;
  }
  const std::string name = fmt::format("synthetic:{}:{}{}", spec.shape.name, spec.mix->name,
                                       spec.seed != 1 ? ":" + std::to_string(spec.seed) : "");
  return gguf::GgufFile::from_parts(name, std::move(layout.metadata), std::move(layout.tensors), memory, alignment);
}

void write_synthetic_model(const SyntheticSpec& spec, const std::string& path, int n_threads) {
  SyntheticLayout layout = synthetic_layout(spec);
  std::vector<gguf::GgufWriter::TensorSpec> specs;
  size_t largest = 0;
  for (const auto& t : layout.tensors) {
    specs.push_back({t.name, t.type, std::vector<int64_t>(t.ne.begin(), t.ne.begin() + t.n_dims)});
    largest = std::max(largest, t.n_bytes);
  }
  gguf::GgufWriter writer(path, layout.metadata, specs);
  std::vector<uint8_t> buffer(largest);
  ThreadPool pool(n_threads);
  for (size_t i = 0; i < layout.tensors.size(); ++i) {
    fill_synthetic_tensor(spec, layout.tensors[i], buffer.data(), pool);
    writer.write_tensor_data(i, buffer.data(), layout.tensors[i].n_bytes);
  }
  writer.finish();
}

}  // namespace roofline
