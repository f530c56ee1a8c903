// GGUF writer: serializes metadata and tensor infos (v3, tensors in order, each padded to the
// alignment) and streams tensor data into a temporary file that finish() renames into place.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>

#include "core/error.h"
#include "formats/gguf.h"

namespace roofline::gguf {
namespace {

class ByteSink {
 public:
  std::vector<uint8_t> bytes;
  void raw(const void* p, size_t n) {
    const uint8_t* b = static_cast<const uint8_t*>(p);
    bytes.insert(bytes.end(), b, b + n);
  }
  template <typename T>
  void scalar(T v) { raw(&v, sizeof(T)); }
  void string(const std::string& s) {
    scalar<uint64_t>(s.size());
    raw(s.data(), s.size());
  }
};

void write_value(ByteSink& out, const Value& v) {
  switch (v.type()) {
    case ValueType::UINT8: case ValueType::INT8: case ValueType::BOOL: out.scalar<uint8_t>((uint8_t)v.raw_int()); break;
    case ValueType::UINT16: case ValueType::INT16: out.scalar<uint16_t>((uint16_t)v.raw_int()); break;
    case ValueType::UINT32: case ValueType::INT32: out.scalar<uint32_t>((uint32_t)v.raw_int()); break;
    case ValueType::UINT64: case ValueType::INT64: out.scalar<uint64_t>(v.raw_int()); break;
    case ValueType::FLOAT32: out.scalar<float>((float)v.raw_float()); break;
    case ValueType::FLOAT64: out.scalar<double>(v.raw_float()); break;
    case ValueType::STRING: out.string(v.as_string()); break;
    case ValueType::ARRAY:
      out.scalar<uint32_t>((uint32_t)v.array_type());
      out.scalar<uint64_t>(v.array_size());
      if (v.array_type() == ValueType::STRING) {
        for (const std::string& s : v.as_string_array()) out.string(s);
      } else {
        out.raw(v.raw_array_bytes().data(), v.raw_array_bytes().size());
      }
      break;
  }
}

std::array<int64_t, kMaxDims> shape_array(const std::vector<int64_t>& shape, const std::string& name) {
  if (shape.empty() || shape.size() > (size_t)kMaxDims) fail("tensor '{}' must have 1 to 4 dimensions", name);
  std::array<int64_t, kMaxDims> ne{1, 1, 1, 1};
  for (size_t i = 0; i < shape.size(); ++i) ne[i] = shape[i];
  return ne;
}

uint64_t pad(uint64_t n, uint32_t alignment) { return (n + alignment - 1) / alignment * alignment; }

std::vector<uint8_t> serialize_header(const Metadata& metadata, const std::vector<GgufWriter::TensorSpec>& specs,
                                      const std::vector<size_t>& sizes, uint32_t alignment) {
  ByteSink out;
  out.raw("GGUF", 4);
  out.scalar<uint32_t>(3);
  out.scalar<int64_t>((int64_t)specs.size());
  // general.alignment is written when it differs from the default (and kept when given).
  Metadata md = metadata;
  if (alignment != kDefaultAlignment || md.contains("general.alignment")) md.set("general.alignment", Value::u32(alignment));
  out.scalar<int64_t>((int64_t)md.size());
  for (const auto& [key, value] : md.entries()) {
    out.string(key);
    out.scalar<uint32_t>((uint32_t)value.type());
    write_value(out, value);
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& s = specs[i];
    out.string(s.name);
    out.scalar<uint32_t>((uint32_t)s.shape.size());
    for (int64_t d : s.shape) out.scalar<int64_t>(d);
    out.scalar<uint32_t>((uint32_t)s.type);
    out.scalar<uint64_t>(offset);
    offset += pad(sizes[i], alignment);
  }
  if (!specs.empty()) out.bytes.resize(pad(out.bytes.size(), alignment), 0);
  return std::move(out.bytes);
}

std::vector<size_t> validate_specs(const std::vector<GgufWriter::TensorSpec>& specs, uint32_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1))) fail("alignment {} is not a power of two", alignment);
  std::vector<size_t> sizes;
  std::set<std::string> names;
  for (const auto& s : specs) {
    if (s.name.empty() || s.name.size() > kMaxTensorName) fail("tensor name '{}' is empty or longer than {} bytes", s.name, kMaxTensorName);
    if (!names.insert(s.name).second) fail("duplicate tensor '{}'", s.name);
    sizes.push_back(tensor_bytes(s.type, shape_array(s.shape, s.name)));
  }
  return sizes;
}

std::vector<GgufWriter::TensorSpec> specs_of(const std::vector<TensorInfo>& tensors) {
  std::vector<GgufWriter::TensorSpec> specs;
  for (const TensorInfo& t : tensors) specs.push_back({t.name, t.type, std::vector<int64_t>(t.ne.begin(), t.ne.begin() + t.n_dims)});
  return specs;
}

}  // namespace

std::vector<uint8_t> serialize_gguf(const Metadata& metadata, const std::vector<TensorInfo>& tensors, uint32_t alignment) {
  const auto specs = specs_of(tensors);
  const auto sizes = validate_specs(specs, alignment);
  std::vector<uint8_t> out = serialize_header(metadata, specs, sizes, alignment);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].data) out.insert(out.end(), tensors[i].data, tensors[i].data + sizes[i]);
    else out.resize(out.size() + sizes[i], 0);
    out.resize(pad(out.size(), alignment), 0);
  }
  return out;
}

GgufWriter::GgufWriter(const std::string& path, const Metadata& metadata, const std::vector<TensorSpec>& tensors,
                       uint32_t alignment)
    : path_(path), specs_(tensors), alignment_(alignment) {
  sizes_ = validate_specs(specs_, alignment_);
  std::random_device rd;
  temp_path_ = fmt::format("{}.tmp-{}-{:08x}", path, ::getpid(), rd());
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("{}: cannot create: {}", temp_path_, std::strerror(errno));
  buffer_.reserve(1 << 22);
  const auto header = serialize_header(metadata, specs_, sizes_, alignment_);
  write_raw(header.data(), header.size());
}

GgufWriter::~GgufWriter() {
  if (!finished_) {
    if (fd_ >= 0) ::close(fd_);
    ::unlink(temp_path_.c_str());
  }
}

void GgufWriter::write_raw(const void* data, size_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  position_ += n;
  if (buffer_.size() + n <= buffer_.capacity()) {
    buffer_.insert(buffer_.end(), p, p + n);
    return;
  }
  auto flush = [&](const uint8_t* q, size_t len) {
    while (len > 0) {
      const ssize_t w = ::write(fd_, q, len);
      if (w < 0) {
        if (errno == EINTR) continue;
        fail("{}: write failed: {}", temp_path_, std::strerror(errno));
      }
      q += w;
      len -= (size_t)w;
    }
  };
  flush(buffer_.data(), buffer_.size());
  buffer_.clear();
  if (n >= buffer_.capacity()) flush(p, n);
  else buffer_.insert(buffer_.end(), p, p + n);
}

void GgufWriter::pad_to_alignment() {
  static const uint8_t zeros[256] = {};
  uint64_t n = pad(position_, alignment_) - position_;
  while (n > 0) {
    const size_t k = (size_t)std::min<uint64_t>(n, sizeof(zeros));
    write_raw(zeros, k);
    n -= k;
  }
}

void GgufWriter::write_tensor_data(size_t index, const void* data, size_t n_bytes) {
  if (finished_) fail("{}: write after finish", path_);
  if (index != next_tensor_) fail("{}: tensor data written out of order (tensor {} while {} is next)", path_, index, next_tensor_);
  if (written_in_tensor_ + n_bytes > sizes_[index])
    fail("{}: tensor '{}' gets more than its {} bytes", path_, specs_[index].name, sizes_[index]);
  write_raw(data, n_bytes);
  written_in_tensor_ += n_bytes;
  if (written_in_tensor_ == sizes_[index]) {
    pad_to_alignment();
    ++next_tensor_;
    written_in_tensor_ = 0;
  }
}

void GgufWriter::finish() {
  if (finished_) return;
  if (next_tensor_ != specs_.size())
    fail("{}: only {} of {} tensors were written", path_, next_tensor_, specs_.size());
  // Flush the buffer by writing nothing past capacity.
  if (!buffer_.empty()) {
    const uint8_t* q = buffer_.data();
    size_t len = buffer_.size();
    while (len > 0) {
      const ssize_t w = ::write(fd_, q, len);
      if (w < 0) {
        if (errno == EINTR) continue;
        fail("{}: write failed: {}", temp_path_, std::strerror(errno));
      }
      q += w;
      len -= (size_t)w;
    }
    buffer_.clear();
  }
  if (::fsync(fd_) != 0) fail("{}: fsync failed: {}", temp_path_, std::strerror(errno));
  if (::close(fd_) != 0) fail("{}: close failed: {}", temp_path_, std::strerror(errno));
  fd_ = -1;
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) fail("{}: cannot rename into place: {}", path_, std::strerror(errno));
  finished_ = true;
}

void write_gguf(const std::string& path, const Metadata& metadata, const std::vector<TensorInfo>& tensors, uint32_t alignment) {
  GgufWriter writer(path, metadata, specs_of(tensors), alignment);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].data) fail("tensor '{}' has no data to write", tensors[i].name);
    writer.write_tensor_data(i, tensors[i].data, writer.tensor_bytes_at(i));
  }
  writer.finish();
}

}  // namespace roofline::gguf
