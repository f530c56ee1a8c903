// Safetensors reader: 8-byte little-endian header length, a JSON header {name: {dtype, shape,
// data_offsets}, "__metadata__": {...}}, then the data. Every number is validated (sizes against dtype
// and shape with overflow checks, ranges inside the data section and disjoint) before use.
#include "formats/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/fp16.h"

namespace roofline::safetensors {
namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

constexpr uint64_t kMaxHeader = 100ull << 20;  // the reference implementation's limit

// The dtype names of the format; only the float ones are convertible.
bool parse_dtype(const std::string& s, DType& out, bool& known) {
  known = true;
  if (s == "F32") return out = DType::F32, true;
  if (s == "F16") return out = DType::F16, true;
  if (s == "BF16") return out = DType::BF16, true;
  static const std::set<std::string> others = {"F64", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8",
                                               "BOOL", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2",
                                               "F4", "C64"};
  known = others.count(s) > 0;
  return false;
}

size_t element_size(DType t) { return t == DType::F32 ? 4 : 2; }

}  // namespace

int64_t Tensor::n_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string Tensor::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::vector<Tensor> parse_safetensors(const std::string& name, const uint8_t* bytes, size_t size,
                                      std::map<std::string, std::string>* metadata) {
  if (size < 8) fail("{}: not a safetensors file ({} bytes, too short for the header length)", name, size);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];
  if (header_len > kMaxHeader) fail("{}: not a safetensors file (header length {} is implausible)", name, header_len);
  if (header_len > size - 8)
    fail("{}: truncated safetensors file: the header needs {} bytes, the file has {}", name, header_len + 8, size);
  if (header_len < 2) fail("{}: not a safetensors file (empty header)", name);
  const char* hp = reinterpret_cast<const char*>(bytes + 8);
  if (hp[0] != '{') fail("{}: not a safetensors file (the header is not a JSON object)", name);
  ojson header;
  try {
    header = ojson::parse(hp, hp + header_len);
  } catch (const std::exception& e) {
    fail("{}: the safetensors header is not valid JSON: {}", name, e.what());
  }
  if (!header.is_object()) fail("{}: the safetensors header is not a JSON object", name);
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = size - data_start;

  std::vector<Tensor> tensors;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& key = it.key();
    const ojson& v = it.value();
    if (key == "__metadata__") {
      if (!v.is_object()) fail("{}: __metadata__ is not an object", name);
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) fail("{}: __metadata__ value '{}' is not a string", name, m.key());
        if (metadata) (*metadata)[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (key.empty()) fail("{}: a tensor has an empty name", name);
    if (!v.is_object()) fail("{}: tensor '{}': entry is not an object", name, key);
    if (!v.contains("dtype") || !v["dtype"].is_string()) fail("{}: tensor '{}' has no dtype", name, key);
    if (!v.contains("shape") || !v["shape"].is_array()) fail("{}: tensor '{}' has no shape", name, key);
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
      fail("{}: tensor '{}' has no data_offsets [begin, end]", name, key);
    Tensor t;
    t.name = key;
    const std::string dtype = v["dtype"].get<std::string>();
    bool known = false;
    if (!parse_dtype(dtype, t.type, known)) {
      if (known) fail("{}: tensor '{}' has dtype {}, which roofline cannot convert (supported: F32, F16, BF16)", name, key, dtype);
      fail("{}: tensor '{}' has unknown dtype '{}'", name, key, dtype);
    }
    const ojson& shape = v["shape"];
    if (shape.size() > 8) fail("{}: tensor '{}' has {} dimensions", name, key, shape.size());
    uint64_t n = 1;
    for (const auto& d : shape) {
      if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0))
        fail("{}: tensor '{}' has a bad dimension {}", name, key, d.dump());
      const uint64_t dim = d.get<uint64_t>();
      if (dim > (1ull << 40) || (dim && n > (1ull << 50) / dim)) fail("{}: tensor '{}' is implausibly large", name, key);
      n *= dim;
      t.shape.push_back((int64_t)dim);
    }
    const ojson& off = v["data_offsets"];
    for (const auto& o : off)
      if (!o.is_number_unsigned() && !(o.is_number_integer() && o.get<int64_t>() >= 0))
        fail("{}: tensor '{}' has a bad data offset {}", name, key, o.dump());
    const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end) fail("{}: tensor '{}' has data_offsets [{}, {}] (begin after end)", name, key, begin, end);
    const uint64_t want = n * element_size(t.type);
    if (end - begin != want)
      fail("{}: tensor '{}' ({} {}) needs {} bytes but data_offsets [{}, {}] hold {}", name, key, dtype, t.shape_string(),
           want, begin, end, end - begin);
    if (end > data_size)
      fail("{}: truncated safetensors file: tensor '{}' ends at byte {} of the data section, which has {} bytes", name, key,
           end, data_size);
    t.data = bytes + data_start + begin;
    t.n_bytes = (size_t)want;
    ranges.push_back({begin, end});
    tensors.push_back(std::move(t));
  }
  // Byte ranges must not overlap (empty tensors may sit anywhere).
  std::vector<size_t> idx(ranges.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return ranges[a] < ranges[b]; });
  uint64_t last_end = 0;
  const Tensor* last = nullptr;
  for (size_t i : idx) {
    if (ranges[i].first == ranges[i].second) continue;
    if (last && ranges[i].first < last_end)
      fail("{}: tensors '{}' and '{}' overlap in the data section", name, last->name, tensors[i].name);
    last_end = ranges[i].second;
    last = &tensors[i];
  }
  return tensors;
}

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  auto f = std::shared_ptr<SafetensorsFile>(new SafetensorsFile());
  f->path_ = path;
  f->map_ = std::make_unique<MappedFile>(path);
  f->tensors_ = parse_safetensors(path, f->map_->data(), f->map_->size(), &f->metadata_);
  for (auto& t : f->tensors_) t.file = &f->path_;
  return f;
}

const Tensor* SafetensorsFile::find(std::string_view name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

SafetensorsModel SafetensorsModel::open_folder(const std::string& dir) {
  SafetensorsModel model;
  const fs::path d(dir);
  if (!fs::is_directory(d)) fail("{}: not a folder", dir);
  const fs::path index_path = d / "model.safetensors.index.json";
  std::map<std::string, std::string> weight_map;  // tensor -> file
  std::vector<std::string> files;
  if (fs::exists(index_path)) {
    std::ifstream in(index_path, std::ios::binary);
    if (!in) fail("{}: cannot open", index_path.string());
    nlohmann::json index;
    try {
      index = nlohmann::json::parse(in);
    } catch (const std::exception& e) {
      fail("{}: not valid JSON: {}", index_path.string(), e.what());
    }
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      fail("{}: has no \"weight_map\" object", index_path.string());
    std::set<std::string> seen;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      if (!it.value().is_string()) fail("{}: weight_map entry '{}' is not a file name", index_path.string(), it.key());
      const std::string file = it.value().get<std::string>();
      if (file.find('/') != std::string::npos || file == ".." || file.empty())
        fail("{}: weight_map names '{}', which is not a file in the folder", index_path.string(), file);
      weight_map[it.key()] = file;
      if (seen.insert(file).second) files.push_back(file);
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files)
      if (!fs::exists(d / f)) fail("{}: shard {} listed in model.safetensors.index.json is missing", dir, f);
  } else {
    for (const auto& e : fs::directory_iterator(d)) {
      const std::string n = e.path().filename().string();
      if (e.is_regular_file() && n.size() > 12 && n.substr(n.size() - 12) == ".safetensors") files.push_back(n);
    }
    std::sort(files.begin(), files.end());
    if (files.empty()) fail("{}: no *.safetensors files (and no model.safetensors.index.json)", dir);
  }
  for (const auto& f : files) model.files_.push_back(SafetensorsFile::open((d / f).string()));

  std::vector<std::string> problems;
  for (const auto& file : model.files_) {
    const std::string base = fs::path(file->path()).filename().string();
    for (const auto& t : file->tensors()) {
      if (!model.by_name_.emplace(t.name, &t).second) {
        problems.push_back(fmt::format("tensor {} is in both {} and {}", t.name, *model.by_name_[t.name]->file, file->path()));
        continue;
      }
      model.order_.push_back(&t);
      if (!weight_map.empty()) {
        auto it = weight_map.find(t.name);
        if (it == weight_map.end()) problems.push_back(fmt::format("{} holds {}, which the index does not list", base, t.name));
        else if (it->second != base) problems.push_back(fmt::format("{} is in {} but the index says {}", t.name, base, it->second));
      }
    }
  }
  for (const auto& [tname, file] : weight_map)
    if (!model.by_name_.count(tname)) problems.push_back(fmt::format("{} (listed in the index for {}) is not in it", tname, file));
  if (!problems.empty()) {
    std::string list;
    for (size_t i = 0; i < problems.size() && i < 6; ++i) list += (i ? "; " : "") + problems[i];
    if (problems.size() > 6) list += fmt::format("; and {} more", problems.size() - 6);
    fail("{}: the safetensors files do not match: {}", dir, list);
  }
  return model;
}

const Tensor* SafetensorsModel::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

void tensor_to_f32(const Tensor& t, int64_t first, int64_t count, float* dst) {
  ROOFLINE_CHECK(first >= 0 && count >= 0 && first + count <= t.n_elements());
  if (t.type == DType::F32) {
    std::memcpy(dst, t.data + first * 4, (size_t)count * 4);
    return;
  }
  const uint8_t* p = t.data + first * 2;
  if (t.type == DType::F16) {
    for (int64_t i = 0; i < count; ++i) {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      dst[i] = fp16_to_f32(h);
    }
  } else {
    for (int64_t i = 0; i < count; ++i) {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      dst[i] = bf16_to_f32(h);
    }
  }
}

}  // namespace roofline::safetensors
