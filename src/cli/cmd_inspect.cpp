// `roofline inspect FILE [--json]`: the metadata and tensor table of a GGUF file (or synthetic model),
// like gguf-dump; --json prints {"metadata": {...}, "tensors": [{name, type, shape, offset, bytes}]}.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/model_options.h"
#include "formats/gguf.h"
#include "model/model_file.h"

namespace roofline::cli {
namespace {

using nlohmann::ordered_json;

ordered_json value_to_json(const gguf::Value& v) {
  using gguf::ValueType;
  auto scalar_json = [](ValueType t, const gguf::Value& x) -> ordered_json {
    if (t == ValueType::STRING) return x.as_string();
    if (t == ValueType::BOOL) return x.as_bool();
    if (t == ValueType::FLOAT32 || t == ValueType::FLOAT64) return x.as_float();
    if (t == ValueType::UINT64) return x.as_uint();
    return x.as_int();
  };
  if (!v.is_array()) return scalar_json(v.type(), v);
  ordered_json arr = ordered_json::array();
  if (v.array_type() == ValueType::STRING) {
    for (const auto& s : v.as_string_array()) arr.push_back(s);
  } else if (v.array_type() == ValueType::BOOL) {
    for (bool b : v.as_bool_array()) arr.push_back(b);
  } else if (v.array_type() == ValueType::FLOAT32 || v.array_type() == ValueType::FLOAT64) {
    for (float f : v.as_float_array()) arr.push_back(f);
  } else {
    for (int64_t i : v.as_int_array()) arr.push_back(i);
  }
  return arr;
}

std::string type_label(const gguf::Value& v) {
  std::string t = gguf::value_type_name(v.type());
  if (v.is_array()) t += std::string("[") + gguf::value_type_name(v.array_type()) + "]";
  return t;
}

int run(int argc, char** argv) {
  CLI::App app{"Print the metadata and tensor table of a GGUF file (or a synthetic:SHAPE:MIX model)"};
  std::string path;
  bool json = false;
  int max_items = 8;
  app.add_option("file", path, "GGUF file or synthetic:SHAPE:MIX")->required();
  app.add_flag("--json", json, "print JSON: {metadata, tensors}");
  app.add_option("--max-array", max_items, "array items shown in the text output")->capture_default_str();
  if (int rc = parse_args(app, argc, argv); rc >= 0) return rc;

  ModelFileOptions options;
  options.layout_only = true;  // a synthetic model's table needs no weights
  auto file = open_model_file(path, options);
  if (json) {
    ordered_json out;
    ordered_json md = ordered_json::object();
    for (const auto& [key, value] : file->metadata().entries()) md[key] = value_to_json(value);
    out["metadata"] = md;
    ordered_json tensors = ordered_json::array();
    for (const auto& t : file->tensors()) {
      ordered_json shape = ordered_json::array();
      for (int i = 0; i < t.n_dims; ++i) shape.push_back(t.ne[i]);
      tensors.push_back({{"name", t.name}, {"type", dtype_name(t.type)}, {"shape", shape},
                         {"offset", file->data_offset() + t.offset}, {"bytes", t.n_bytes}});
    }
    out["tensors"] = tensors;
    std::string s = out.dump(1, ' ', false, ordered_json::error_handler_t::replace);
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fputc('\n', stdout);
    return 0;
  }

  std::printf("* %s: GGUF v%u, %zu metadata entries, %zu tensors, %.2f MiB of tensor data%s\n", file->name().c_str(),
              file->version(), file->metadata().size(), file->tensors().size(),
              file->total_tensor_bytes() / 1048576.0, file->in_memory() ? " (built in memory)" : "");
  std::printf("* metadata\n");
  int i = 0;
  for (const auto& [key, value] : file->metadata().entries()) {
    std::printf("%6d: %-14s | %8zu | %s = %s\n", ++i, type_label(value).c_str(), value.is_array() ? value.array_size() : 1,
                key.c_str(), value.to_display((size_t)max_items).c_str());
  }
  std::printf("* tensors\n");
  std::printf("%6s  %-12s %-28s %-8s %14s  %s\n", "#", "elements", "shape", "type", "bytes", "name");
  i = 0;
  for (const auto& t : file->tensors()) {
    std::printf("%6d: %-12lld %-28s %-8s %14zu  %s\n", ++i, (long long)t.n_elements(), t.shape_string().c_str(),
                dtype_name(t.type).c_str(), t.n_bytes, t.name.c_str());
  }
  return 0;
}

int run_inspect(int argc, char** argv) { return run_guarded(run, argc, argv); }
const CommandRegistration registration{"inspect", "print a GGUF file's metadata and tensor table", run_inspect, 90};

}  // namespace
}  // namespace roofline::cli
