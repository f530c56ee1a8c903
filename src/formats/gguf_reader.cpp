// GGUF reader: parses and validates the header, metadata and tensor infos of a file image, and
// hands out zero-copy views of tensor data. Every problem is one Error("NAME: what is wrong").
#include <algorithm>
#include <cstring>
#include <limits>
#include <set>

#include "core/error.h"
#include "core/mapped_file.h"
#include "formats/gguf.h"

namespace roofline::gguf {

std::string TensorInfo::shape_string() const {
  std::string s = "[";
  for (int i = 0; i < n_dims; ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

size_t tensor_bytes(DType type, const std::array<int64_t, kMaxDims>& ne) {
  const DTypeTraits& t = dtype_traits(type);
  for (int i = 0; i < kMaxDims; ++i)
    if (ne[i] < 0) fail("negative dimension {}", ne[i]);
  if (ne[0] % t.block_size != 0)
    fail("row length {} is not a multiple of the {} block size {}", ne[0], dtype_name(type), t.block_size);
  // Overflow-checked product of rows and bytes.
  unsigned __int128 bytes = (unsigned __int128)(ne[0] / t.block_size) * t.block_bytes;
  for (int i = 1; i < kMaxDims; ++i) bytes *= (unsigned __int128)ne[i];
  if (bytes > (unsigned __int128)std::numeric_limits<int64_t>::max()) fail("tensor size overflows");
  return (size_t)bytes;
}

class Parser {
 public:
  Parser(const std::string& name, const uint8_t* data, size_t size) : name_(name), data_(data), size_(size) {}

  std::shared_ptr<GgufFile> parse(std::shared_ptr<const void> owner) {
    auto file = std::shared_ptr<GgufFile>(new GgufFile());
    file->name_ = name_;
    file->file_size_ = size_;
    file->owner_ = std::move(owner);

    if (size_ < 4) error("too small to be a GGUF file ({} bytes)", size_);
    if (std::memcmp(data_, "GGUF", 4) != 0) error("bad magic (not a GGUF file)");
    pos_ = 4;
    const uint32_t version = read_u32("version");
    if ((version & 0xffff) == 0) error("version {:#x} looks byte-swapped: big-endian GGUF files are not supported", version);
    if (version == 1) error("GGUF version 1 is not supported (only versions 2 and 3)");
    if (version > 3) error("unsupported GGUF version {} (only versions 2 and 3)", version);
    file->version_ = version;
    const int64_t n_tensors = read_i64("tensor count");
    const int64_t n_kv = read_i64("metadata count");
    if (n_tensors < 0) error("negative tensor count {}", n_tensors);
    if (n_kv < 0) error("negative metadata count {}", n_kv);
    // Each entry needs at least this many bytes, which bounds the counts before any allocation.
    if ((uint64_t)n_kv > remaining() / 13) error("truncated: {} metadata entries cannot fit in the file", n_kv);
    if ((uint64_t)n_tensors > remaining() / 25) error("truncated: {} tensor infos cannot fit in the file", n_tensors);

    for (int64_t i = 0; i < n_kv; ++i) {
      std::string key = read_string("metadata key");
      if (key.empty()) error("metadata entry {} has an empty key", i);
      if (file->metadata_.contains(key)) error("duplicate metadata key '{}'", key);
      const uint32_t type_id = read_u32("metadata type");
      file->metadata_.set(key, read_value(key, type_id));
    }

    file->alignment_ = kDefaultAlignment;
    if (const Value* a = file->metadata_.find("general.alignment")) {
      if (a->type() != ValueType::UINT32)
        error("general.alignment has type {}, expected u32", value_type_name(a->type()));
      const uint64_t al = a->raw_int();
      if (al == 0 || (al & (al - 1)) != 0) error("general.alignment {} is not a power of two", al);
      file->alignment_ = (uint32_t)al;
    }

    file->tensors_.reserve((size_t)n_tensors);
    std::set<std::string, std::less<>> names;
    for (int64_t i = 0; i < n_tensors; ++i) {
      TensorInfo t;
      t.name = read_string("tensor name");
      if (t.name.empty()) error("tensor {} has an empty name", i);
      if (t.name.size() > kMaxTensorName)
        error("tensor name '{}...' is {} bytes, longer than the limit of {}", t.name.substr(0, 40), t.name.size(), kMaxTensorName);
      if (!names.insert(t.name).second) error("duplicate tensor '{}'", t.name);
      const uint32_t n_dims = read_u32("tensor dimension count");
      if (n_dims == 0 || n_dims > (uint32_t)kMaxDims) error("tensor '{}' has {} dimensions (1 to 4 allowed)", t.name, n_dims);
      t.n_dims = (int)n_dims;
      for (uint32_t d = 0; d < n_dims; ++d) {
        const int64_t ne = read_i64("tensor dimension");
        if (ne < 0) error("tensor '{}' has a negative dimension {}", t.name, ne);
        t.ne[d] = ne;
      }
      const uint32_t type_id = read_u32("tensor type");
      const DTypeTraits* traits = dtype_traits_or_null(type_id);
      if (!traits) error("tensor '{}' has unknown type id {}", t.name, type_id);
      t.type = (DType)type_id;
      // Element count must not overflow int64 (ggml's check), then the byte size.
      unsigned __int128 elements = 1;
      for (int d = 0; d < kMaxDims; ++d) elements *= (unsigned __int128)t.ne[d];
      if (elements > (unsigned __int128)std::numeric_limits<int64_t>::max())
        error("tensor '{}' dimensions {} overflow", t.name, t.shape_string());
      if (t.ne[0] % traits->block_size != 0)
        error("tensor '{}' row length {} is not a multiple of the {} block size {}", t.name, t.ne[0],
              dtype_name(t.type), traits->block_size);
      try {
        t.n_bytes = tensor_bytes(t.type, t.ne);
      } catch (const Error& e) {
        error("tensor '{}': {}", t.name, e.what());
      }
      t.offset = read_u64("tensor offset");
      if (t.offset % file->alignment_ != 0)
        error("tensor '{}' offset {} is not aligned to {}", t.name, t.offset, file->alignment_);
      file->tensors_.push_back(std::move(t));
    }

    // The data section starts at the next aligned position (only when there are tensors).
    uint64_t data_offset = pos_;
    if (n_tensors > 0) data_offset = (pos_ + file->alignment_ - 1) / file->alignment_ * file->alignment_;
    file->data_offset_ = data_offset;
    if (n_tensors > 0 && data_offset > size_) error("truncated: the data section would start at {} past the end ({} bytes)", data_offset, size_);

    std::vector<const TensorInfo*> by_offset;
    for (TensorInfo& t : file->tensors_) {
      const uint64_t avail = size_ - std::min<uint64_t>(size_, data_offset);
      if (t.offset > avail || t.n_bytes > avail - t.offset)
        error("tensor '{}' data ({} bytes at offset {}) is out of range of the file's {}-byte data section", t.name,
              t.n_bytes, t.offset, avail);
      t.data = data_ + data_offset + t.offset;
      by_offset.push_back(&t);
    }
    std::sort(by_offset.begin(), by_offset.end(),
              [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
      const TensorInfo* a = by_offset[i - 1];
      const TensorInfo* b = by_offset[i];
      if (a->n_bytes > 0 && b->n_bytes > 0 && a->offset + a->n_bytes > b->offset)
        error("tensors '{}' and '{}' overlap", a->name, b->name);
    }
    file->build_index();
    return file;
  }

 private:
  template <typename... Args>
  [[noreturn]] void error(fmt::format_string<Args...> format, Args&&... args) {
    throw Error(name_ + ": " + fmt::format(format, std::forward<Args>(args)...));
  }

  uint64_t remaining() const { return size_ - pos_; }

  void need(uint64_t n, const char* what) {
    if (n > remaining()) error("truncated file: {} needs {} bytes at offset {}, {} left", what, n, pos_, remaining());
  }

  template <typename T>
  T read_scalar(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  uint32_t read_u32(const char* what) { return read_scalar<uint32_t>(what); }
  uint64_t read_u64(const char* what) { return read_scalar<uint64_t>(what); }
  int64_t read_i64(const char* what) { return read_scalar<int64_t>(what); }

  std::string read_string(const char* what) {
    const uint64_t len = read_u64(what);
    need(len, what);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), (size_t)len);
    pos_ += len;
    return s;
  }

  Value read_value(const std::string& key, uint32_t type_id) {
    if (type_id > (uint32_t)ValueType::FLOAT64) error("metadata key '{}' has unknown value type {}", key, type_id);
    const ValueType type = (ValueType)type_id;
    if (type == ValueType::STRING) return Value::string(read_string("string value"));
    if (type == ValueType::ARRAY) {
      const uint32_t elem_id = read_u32("array element type");
      if (elem_id > (uint32_t)ValueType::FLOAT64) error("metadata key '{}' has unknown array element type {}", key, elem_id);
      const ValueType elem = (ValueType)elem_id;
      if (elem == ValueType::ARRAY) error("metadata key '{}' is an array of arrays, which is not supported", key);
      const uint64_t count = read_u64("array length");
      if (elem == ValueType::STRING) {
        if (count > remaining() / 8) error("truncated file: array '{}' of {} strings cannot fit", key, count);
        std::vector<std::string> items;
        items.reserve((size_t)count);
        for (uint64_t i = 0; i < count; ++i) items.push_back(read_string("array string"));
        return Value::string_array(std::move(items));
      }
      const size_t elem_size = value_type_size(elem);
      if (count > remaining() / elem_size) error("truncated file: array '{}' of {} elements cannot fit", key, count);
      std::vector<uint8_t> bytes(data_ + pos_, data_ + pos_ + count * elem_size);
      pos_ += count * elem_size;
      if (elem == ValueType::BOOL)
        for (uint8_t b : bytes)
          if (b > 1) error("metadata key '{}' has a bool array element {} (must be 0 or 1)", key, b);
      return Value::raw_array(elem, std::move(bytes));
    }
    switch (type) {
      case ValueType::UINT8: return Value::u8(read_scalar<uint8_t>("u8 value"));
      case ValueType::INT8: return Value::i8(read_scalar<int8_t>("i8 value"));
      case ValueType::UINT16: return Value::u16(read_scalar<uint16_t>("u16 value"));
      case ValueType::INT16: return Value::i16(read_scalar<int16_t>("i16 value"));
      case ValueType::UINT32: return Value::u32(read_scalar<uint32_t>("u32 value"));
      case ValueType::INT32: return Value::i32(read_scalar<int32_t>("i32 value"));
      case ValueType::UINT64: return Value::u64(read_scalar<uint64_t>("u64 value"));
      case ValueType::INT64: return Value::i64(read_scalar<int64_t>("i64 value"));
      case ValueType::FLOAT32: return Value::f32(read_scalar<float>("f32 value"));
      case ValueType::FLOAT64: return Value::f64(read_scalar<double>("f64 value"));
      case ValueType::BOOL: {
        const uint8_t b = read_scalar<uint8_t>("bool value");
        if (b > 1) error("metadata key '{}' has bool value {} (must be 0 or 1)", key, b);
        return Value::boolean(b != 0);
      }
      default: break;
    }
    error("metadata key '{}' has unknown value type {}", key, type_id);
  }

  std::string name_;
  const uint8_t* data_;
  size_t size_;
  uint64_t pos_ = 0;
};

void GgufFile::build_index() {
  tensor_index_.clear();
  for (size_t i = 0; i < tensors_.size(); ++i) tensor_index_.emplace(tensors_[i].name, i);
}

std::shared_ptr<GgufFile> GgufFile::open(const std::string& path) {
  auto mapping = std::make_shared<MappedFile>(path);
  const uint8_t* data = mapping->data();
  const size_t size = mapping->size();
  return Parser(path, data, size).parse(std::move(mapping));
}

std::shared_ptr<GgufFile> GgufFile::parse(const std::string& name, const uint8_t* data, size_t size,
                                          std::shared_ptr<const void> owner) {
  return Parser(name, data, size).parse(std::move(owner));
}

std::shared_ptr<GgufFile> GgufFile::from_parts(std::string name, Metadata metadata, std::vector<TensorInfo> tensors,
                                               std::shared_ptr<const void> owner, uint32_t alignment) {
  auto file = std::shared_ptr<GgufFile>(new GgufFile());
  file->name_ = std::move(name);
  file->metadata_ = std::move(metadata);
  file->tensors_ = std::move(tensors);
  file->owner_ = std::move(owner);
  file->alignment_ = alignment;
  file->in_memory_ = true;
  uint64_t offset = 0;
  for (TensorInfo& t : file->tensors_) {
    t.n_bytes = tensor_bytes(t.type, t.ne);
    t.offset = offset;
    offset += (t.n_bytes + alignment - 1) / alignment * alignment;
  }
  file->file_size_ = offset;
  file->build_index();
  ROOFLINE_CHECK(file->tensor_index_.size() == file->tensors_.size(), "duplicate tensor names in {}", file->name_);
  return file;
}

const TensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& GgufFile::tensor(std::string_view name) const {
  const TensorInfo* t = find_tensor(name);
  if (!t) fail("{}: tensor '{}' is missing", name_, name);
  return *t;
}

uint64_t GgufFile::total_tensor_bytes() const {
  uint64_t n = 0;
  for (const TensorInfo& t : tensors_) n += t.n_bytes;
  return n;
}

}  // namespace roofline::gguf
