// GGUF files: a strict reader (mmap, zero-copy tensor views) and a writer (temporary file renamed at
// the end). The same GgufFile type also holds models built in memory (synthetic models), so every
// command that takes -m works on either. Layout facts: ../shared/reference/llama-cpp-facts.md §1.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "formats/dtype.h"
#include "formats/gguf_metadata.h"

namespace roofline::gguf {

constexpr uint32_t kDefaultAlignment = 32;
constexpr size_t kMaxTensorName = 63;  // GGML_MAX_NAME (64) minus the terminating NUL
constexpr int kMaxDims = 4;

struct TensorInfo {
  std::string name;
  DType type = DType::F32;
  int n_dims = 1;
  std::array<int64_t, kMaxDims> ne{1, 1, 1, 1};  // innermost (row length) first, as GGUF stores it
  uint64_t offset = 0;                            // relative to the start of the data section
  size_t n_bytes = 0;
  const uint8_t* data = nullptr;                  // view into the file mapping or memory buffer

  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  int64_t row_length() const { return ne[0]; }
  int64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
  std::string shape_string() const;  // "[4096, 151936]"
};

// Bytes of a tensor of this type and shape; throws Error on a bad row length or overflow.
size_t tensor_bytes(DType type, const std::array<int64_t, kMaxDims>& ne);

class GgufFile {
 public:
  // Opens and validates a file; throws Error("PATH: problem") on anything malformed.
  static std::shared_ptr<GgufFile> open(const std::string& path);
  // Parses a file image already in memory (the caller keeps `data` alive through `owner`).
  static std::shared_ptr<GgufFile> parse(const std::string& name, const uint8_t* data, size_t size,
                                         std::shared_ptr<const void> owner = nullptr);
  // A model assembled in memory: tensors' `data` must point into memory kept alive by `owner`.
  static std::shared_ptr<GgufFile> from_parts(std::string name, Metadata metadata, std::vector<TensorInfo> tensors,
                                              std::shared_ptr<const void> owner, uint32_t alignment = kDefaultAlignment);

  const std::string& name() const { return name_; }  // path, or the synthetic spec
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // file offset of the data section (0 in memory)
  uint64_t file_size() const { return file_size_; }
  bool in_memory() const { return in_memory_; }

  const Metadata& metadata() const { return metadata_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;
  const TensorInfo& tensor(std::string_view name) const;  // throws Error naming the file when missing
  uint64_t total_tensor_bytes() const;

 private:
  std::string name_;
  uint32_t version_ = 3;
  uint32_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  uint64_t file_size_ = 0;
  bool in_memory_ = false;
  Metadata metadata_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
  std::shared_ptr<const void> owner_;

  friend class Parser;
  void build_index();
};

// Writes a GGUF v3 file in one pass: header and tensor infos first, then each tensor's data in order
// (so a quantizer can stream tensor by tensor). The data goes to PATH.tmp-XXXX, renamed to PATH by
// finish(); a writer destroyed before finish() removes the temporary file.
class GgufWriter {
 public:
  struct TensorSpec {
    std::string name;
    DType type;
    std::vector<int64_t> shape;  // innermost first, 1..4 dims
  };

  GgufWriter(const std::string& path, const Metadata& metadata, const std::vector<TensorSpec>& tensors,
             uint32_t alignment = kDefaultAlignment);
  ~GgufWriter();
  GgufWriter(const GgufWriter&) = delete;
  GgufWriter& operator=(const GgufWriter&) = delete;

  size_t tensor_count() const { return specs_.size(); }
  size_t tensor_bytes_at(size_t index) const { return sizes_[index]; }
  // Tensor data must be written in order, each exactly tensor_bytes_at(i) bytes (in one or more calls).
  void write_tensor_data(size_t index, const void* data, size_t n_bytes);
  void finish();  // pads, flushes, fsyncs and renames into place

 private:
  void write_raw(const void* data, size_t n);
  void pad_to_alignment();

  std::string path_, temp_path_;
  int fd_ = -1;
  std::vector<TensorSpec> specs_;
  std::vector<size_t> sizes_;
  uint32_t alignment_;
  uint64_t position_ = 0;
  size_t next_tensor_ = 0;
  size_t written_in_tensor_ = 0;
  std::vector<uint8_t> buffer_;
  bool finished_ = false;
};

// Convenience: writes a whole model whose tensor data is in memory (e.g. a GgufFile's views).
void write_gguf(const std::string& path, const Metadata& metadata, const std::vector<TensorInfo>& tensors,
                uint32_t alignment = kDefaultAlignment);

// Serializes header + metadata + tensor infos exactly as the writer does (used by tests and fuzzing).
std::vector<uint8_t> serialize_gguf(const Metadata& metadata, const std::vector<TensorInfo>& tensors,
                                    uint32_t alignment = kDefaultAlignment);

}  // namespace roofline::gguf
