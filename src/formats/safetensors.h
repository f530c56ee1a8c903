// Hugging Face .safetensors files: a strict, zero-copy reader (mmap; the JSON header's dtypes, shapes and
// byte ranges are all checked against the file before any data is touched) and a model-folder loader that
// follows model.safetensors.index.json or reads every *.safetensors. Float types only (F32, F16, BF16).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/mapped_file.h"
#include "formats/dtype.h"

namespace roofline::safetensors {

struct Tensor {
  std::string name;
  DType type = DType::F32;       // F32, F16 or BF16
  std::vector<int64_t> shape;    // outermost first (PyTorch order): a matrix is [out, in]
  const uint8_t* data = nullptr; // view into the mapping (not necessarily aligned: read with memcpy)
  size_t n_bytes = 0;
  const std::string* file = nullptr;  // path of the file holding it

  int64_t n_elements() const;
  std::string shape_string() const;  // "[896, 151936]" in PyTorch order
};

class SafetensorsFile {
 public:
  // Opens and validates; throws Error("PATH: problem") on anything malformed or unsupported.
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<Tensor>& tensors() const { return tensors_; }  // in header order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }  // "__metadata__"
  const Tensor* find(std::string_view name) const;

 private:
  std::string path_;
  std::unique_ptr<MappedFile> map_;
  std::vector<Tensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Parses a header (tests and fuzzing): `bytes` is the whole file image. Same checks as open().
std::vector<Tensor> parse_safetensors(const std::string& name, const uint8_t* bytes, size_t size,
                                      std::map<std::string, std::string>* metadata = nullptr);

// Every tensor of a Hugging Face model folder, by name, over one or several files.
class SafetensorsModel {
 public:
  // dir/model.safetensors.index.json when present (every listed tensor must be in the file it names,
  // and every file's tensors must be listed), else every *.safetensors in dir. Throws Error naming the
  // folder or file on any problem (no weights, a missing shard, a tensor in two files, ...).
  static SafetensorsModel open_folder(const std::string& dir);

  const Tensor* find(std::string_view name) const;
  const std::vector<const Tensor*>& tensors() const { return order_; }  // files in order, header order within
  const std::vector<std::shared_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::vector<const Tensor*> order_;
  std::map<std::string, const Tensor*, std::less<>> by_name_;
};

// Converts elements [first, first + count) of a tensor to f32 (exact for every supported type).
void tensor_to_f32(const Tensor& tensor, int64_t first, int64_t count, float* dst);

}  // namespace roofline::safetensors
