// Read-only memory map of a whole file (zero-copy tensor views point into it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace roofline {

class MappedFile {
 public:
  // Throws Error("PATH: reason") when the file cannot be opened or mapped.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Drops this process's pages of [p, p + n) (the whole pages inside it) from a read-only file mapping: they
// leave the resident set and stay in the page cache, and a later read maps them again. For data that
// has been copied elsewhere (repacked weights). Only for MappedFile memory (anonymous memory would read
// back as zeros); errors are ignored.
void release_mapped_pages(const void* p, size_t n);

}  // namespace roofline
