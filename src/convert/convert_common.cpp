// The converters' shared half: output-type rules (llama.cpp's), the Q/K permutation, value conversion
// with f16 saturation counting, a checkpoint's text tensors in llama.cpp's order, and the streaming
// writer loop with its progress line.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <fstream>

#include "convert/convert.h"
#include "convert/convert_hf_util.h"
#include "core/error.h"
#include "core/fp16.h"
#include "core/thread_pool.h"
#include "formats/gguf.h"
#include "formats/quant_ref.h"

namespace roofline::convert {

nlohmann::json read_json_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) fail("{}: cannot open", p.string());
  try {
    return nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    fail("{}: not valid JSON: {}", p.string(), e.what());
  }
}

int64_t HfConfig::integer(const char* key) const {
  if (!has(key)) fail("{}: \"{}\" is missing", where, key);
  if (!j[key].is_number_integer()) fail("{}: \"{}\" is not an integer", where, key);
  const int64_t v = j[key].get<int64_t>();
  if (v <= 0 || v > (1ll << 31)) fail("{}: \"{}\" = {} is out of range", where, key, v);
  return v;
}

double HfConfig::number(const char* key) const {
  if (!has(key)) fail("{}: \"{}\" is missing", where, key);
  if (!j[key].is_number()) fail("{}: \"{}\" is not a number", where, key);
  return j[key].get<double>();
}

double HfConfig::number_or(const nlohmann::json& obj, const char* key, double fallback) const {
  if (!obj.is_object() || !obj.contains(key) || obj[key].is_null()) return fallback;
  if (!obj[key].is_number()) fail("{}: \"{}\" is not a number", where, key);
  return obj[key].get<double>();
}

bool HfConfig::boolean_or(const char* key, bool fallback) const {
  if (!has(key)) return fallback;
  if (!j[key].is_boolean()) fail("{}: \"{}\" is not true or false", where, key);
  return j[key].get<bool>();
}

HfConfig text_model_config(const nlohmann::json& config, const std::string& where_file) {
  HfConfig c{config, where_file};
  if (config.contains("text_config") && config["text_config"].is_object()) {
    for (auto it = config["text_config"].begin(); it != config["text_config"].end(); ++it) c.j[it.key()] = it.value();
    c.where += " (text_config)";
  }
  return c;
}

bool is_multimodal_tensor(const std::string& n) {
  for (const char* p : {"mlp", "vit.", "vpm.", "siglip2.", "conformer.", "merger.", "resampler.", "sound_encoder.",
                        "sound_projection.", "speech_embeddings."})
    if (n.rfind(p, 0) == 0) return true;
  for (const char* p : {"visual.", "vision.", "audio.", "talker.", "vision_", "audio_", "token2wav.", "code2wav.",
                        "projector.", "pre_mm_projector_norm", "image_newline", "view_seperator", "patch_embed",
                        "patch_embedding", "patch_merger.", "patch_merge_mlp.", "model.connector."})
    if (n.find(p) != std::string::npos) return true;
  return false;
}

std::vector<HfTensor> text_model_tensors(const safetensors::SafetensorsModel& st, size_t* n_multimodal) {
  std::vector<HfTensor> items;
  *n_multimodal = 0;
  for (const auto& file : st.files()) {
    std::vector<const safetensors::Tensor*> ts;
    for (const auto& t : file->tensors()) ts.push_back(&t);
    std::sort(ts.begin(), ts.end(), [](auto* a, auto* b) { return a->name < b->name; });
    for (const safetensors::Tensor* t : ts) {
      if (is_multimodal_tensor(t->name)) {
        ++*n_multimodal;
        continue;
      }
      std::string n = t->name;
      for (size_t pos; (pos = n.find("language_model.")) != std::string::npos;) n.erase(pos, 15);
      if (n.size() >= 20 && n.compare(n.size() - 20, 20, ".rotary_emb.inv_freq") == 0) continue;
      items.push_back({t, std::move(n)});
    }
  }
  return items;
}

std::string shape_string(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

void fail_with_problems(const std::string& prefix, const std::vector<std::string>& problems, size_t shown) {
  std::string list;
  const size_t n = std::min(problems.size(), shown);
  for (size_t i = 0; i < n; ++i) list += (i ? "; " : "") + problems[i];
  if (problems.size() > n) list += fmt::format("; and {} more", problems.size() - n);
  fail("{}: {}", prefix, list);
}

std::optional<DType> parse_outtype(const std::string& name) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return (char)std::tolower(c); });
  if (n == "auto") return std::nullopt;
  if (n == "f32") return DType::F32;
  if (n == "f16") return DType::F16;
  if (n == "bf16") return DType::BF16;
  if (n == "q8_0") return DType::Q8_0;
  fail("unknown --outtype '{}' (known: auto, f32, f16, bf16, q8_0)", name);
}

uint32_t file_type_for(DType t) {
  switch (t) {
    case DType::F32: return 0;
    case DType::F16: return 1;
    case DType::Q8_0: return 7;
    case DType::BF16: return 32;
    default: fail("no file type for {}", dtype_name(t));
  }
}

DType tensor_type_for(const std::string& name, int n_dims, int64_t row_length, DType outtype, std::string* note) {
  auto ends_with = [&](const char* s) {
    const size_t n = std::strlen(s);
    return name.size() >= n && name.compare(name.size() - n, n, s) == 0;
  };
  // llama.cpp (conversion/base.py prepare_tensors): 1-D, *_norm.weight, SSM_CONV1D, the MoE routers
  // (FFN_GATE_INP, FFN_GATE_INP_SHEXP) and non-".weight" names stay F32.
  if (n_dims <= 1 || ends_with("_norm.weight") || ends_with(".ssm_conv1d.weight") || !ends_with(".weight") ||
      ends_with(".ffn_gate_inp.weight") || ends_with(".ffn_gate_inp_shexp.weight"))
    return DType::F32;
  if (outtype == DType::Q8_0 && row_length % dtype_block_size(DType::Q8_0) != 0) {
    if (note) *note = fmt::format("{}: row length {} is not a multiple of 32, stored as F16 instead of Q8_0", name, row_length);
    return DType::F16;
  }
  return outtype;
}

void permute_qk_rows(const float* src, float* dst, int64_t n_head, int64_t head_dim, int64_t row_length) {
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < n_head; ++h)
    for (int64_t part = 0; part < 2; ++part)
      for (int64_t i = 0; i < half; ++i) {
        const int64_t from = h * head_dim + part * half + i, to = h * head_dim + 2 * i + part;
        std::memcpy(dst + to * row_length, src + from * row_length, (size_t)row_length * sizeof(float));
      }
}

void unpermute_qk_rows(const float* src, float* dst, int64_t n_head, int64_t head_dim, int64_t row_length) {
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < n_head; ++h)
    for (int64_t part = 0; part < 2; ++part)
      for (int64_t i = 0; i < half; ++i) {
        const int64_t gguf_row = h * head_dim + 2 * i + part, hf_row = h * head_dim + part * half + i;
        std::memcpy(dst + hf_row * row_length, src + gguf_row * row_length, (size_t)row_length * sizeof(float));
      }
}

void convert_values(const float* src, int64_t n, int64_t row_length, DType type, uint8_t* dst, int64_t* saturated,
                    int64_t* flushed) {
  switch (type) {
    case DType::F32:
      std::memcpy(dst, src, (size_t)n * 4);
      return;
    case DType::F16: {
      int64_t sat = 0, flush = 0;
      for (int64_t i = 0; i < n; ++i) {
        const float x = src[i];
        uint16_t h = f32_to_fp16(x);
        if ((h & 0x7c00u) == 0x7c00u && std::isfinite(x)) {  // a finite value that rounds to inf
          h = (uint16_t)((h & 0x8000u) | 0x7bffu);             // ±65504
          ++sat;
        } else if ((h & 0x7fffu) == 0 && x != 0.0f) {
          ++flush;
        }
        std::memcpy(dst + 2 * i, &h, 2);
      }
      if (saturated) *saturated += sat;
      if (flushed) *flushed += flush;
      return;
    }
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_bf16(src[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    case DType::Q8_0:
      ROOFLINE_CHECK(row_length > 0 && n % row_length == 0);
      quantize_rows_ref(DType::Q8_0, src, dst, n / row_length, row_length);
      return;
    default:
      fail("cannot convert to {}", dtype_name(type));
  }
}

void write_converted(const ConvertOptions& options, const gguf::Metadata& metadata,
                     const std::vector<PlannedTensor>& tensors, ConvertResult& result) {
  std::vector<gguf::GgufWriter::TensorSpec> specs;
  for (const auto& t : tensors) specs.push_back({t.name, t.type, t.shape});
  ThreadPool pool(options.n_threads > 0 ? options.n_threads : ThreadPool::default_thread_count());
  const bool show_progress = options.progress && ::isatty(STDERR_FILENO);

  gguf::GgufWriter writer(options.output, metadata, specs);
  uint64_t total_bytes = 0, done_bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) total_bytes += writer.tensor_bytes_at(i);

  std::vector<float> values;
  std::vector<uint8_t> out;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const PlannedTensor& t = tensors[i];
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    const int64_t row = t.shape[0];
    const int64_t n_rows = n / row;
    const size_t row_bytes = dtype_row_bytes(t.type, row);
    ROOFLINE_CHECK(row_bytes * (size_t)n_rows == writer.tensor_bytes_at(i), "{}", t.name);
    const int64_t chunk_rows = std::max<int64_t>(1, options.chunk_elements / row);
    int64_t tensor_sat = 0;
    for (int64_t r0 = 0; r0 < n_rows; r0 += chunk_rows) {
      const int64_t nr = std::min(chunk_rows, n_rows - r0);
      values.resize((size_t)(nr * row));
      t.fill(values.data(), r0, nr);
      out.resize((size_t)nr * row_bytes);
      // Rows are independent: convert in fixed groups of rows (the result does not depend on threads).
      const int64_t group = std::max<int64_t>(1, (1 << 16) / row);
      const size_t n_groups = (size_t)((nr + group - 1) / group);
      std::vector<int64_t> sat(n_groups, 0), flush(n_groups, 0);
      pool.parallel_for(n_groups, [&](size_t g) {
        const int64_t g0 = (int64_t)g * group, g1 = std::min(nr, g0 + group);
        convert_values(values.data() + g0 * row, (g1 - g0) * row, row, t.type, out.data() + g0 * row_bytes, &sat[g],
                       &flush[g]);
      });
      for (size_t g = 0; g < n_groups; ++g) {
        tensor_sat += sat[g];
        result.f16_flushed += flush[g];
      }
      writer.write_tensor_data(i, out.data(), out.size());
      done_bytes += out.size();
      if (show_progress)
        std::fprintf(stderr, "\rconvert: [%zu/%zu] %5.1f%% %-40.40s", i + 1, tensors.size(),
                     total_bytes ? 100.0 * (double)done_bytes / (double)total_bytes : 100.0, t.name.c_str());
    }
    if (tensor_sat) {
      result.f16_saturated += tensor_sat;
      result.notes.push_back(fmt::format("{}: {} values beyond the f16 range were stored as ±65504", t.name, tensor_sat));
    }
    result.n_params += (uint64_t)n;
  }
  if (show_progress) std::fprintf(stderr, "\n");
  writer.finish();
  result.n_tensors = tensors.size();
  result.file_bytes = std::filesystem::file_size(options.output);
}

ConvertResult convert_model(const ConvertOptions& options) {
  if (options.source.empty()) fail("convert: no source given");
  if (options.output.empty()) fail("convert: no output given (-o OUT.gguf)");
  namespace fs = std::filesystem;
  // The output's folder is checked first: a typo there should not cost a whole conversion.
  std::error_code ec;
  const fs::path out_dir = fs::absolute(fs::path(options.output), ec).parent_path();
  if (!fs::is_directory(out_dir, ec)) fail("-o {}: the folder {} does not exist", options.output, out_dir.string());
  if (access(out_dir.c_str(), W_OK) != 0) fail("-o {}: the folder {} is not writable", options.output, out_dir.string());
  if (fs::is_directory(options.output, ec)) fail("-o {}: is a folder; give the output file's name", options.output);
  if (fs::is_directory(options.source)) return convert_hf(options);
  if (!fs::exists(options.source)) fail("{}: no such file or folder", options.source);
  {  // A GGUF file needs no conversion (llama2.c checkpoints start with their header, never "GGUF").
    std::ifstream f(options.source, std::ios::binary);
    char magic[4] = {0, 0, 0, 0};
    f.read(magic, 4);
    if (f && std::memcmp(magic, "GGUF", 4) == 0)
      fail("{}: already a GGUF file; nothing to convert (roofline quantize changes its type, roofline inspect shows it)",
           options.source);
  }
  return convert_llama2c(options);
}

}  // namespace roofline::convert
