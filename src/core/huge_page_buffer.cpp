// HugePageBuffer (huge_page_buffer.h): from 2 MiB, mmap a span 2 MiB larger than needed and keep its
// 2 MiB-aligned part; below, the heap.
#include "core/huge_page_buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "core/error.h"

namespace roofline {

namespace {
constexpr size_t kHugePage = size_t{2} << 20;

bool huge_pages_wanted() {
  static const bool on = [] {
    const char* v = std::getenv("ROOFLINE_HUGE_PAGES");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}
}  // namespace

HugePageBuffer::HugePageBuffer(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  if (bytes < kHugePage) {
    data_ = static_cast<uint8_t*>(::operator new[](bytes, std::align_val_t(64)));
    std::memset(data_, 0, bytes);
    return;
  }
  const size_t page = (size_t)::sysconf(_SC_PAGESIZE);
  mapped_ = (bytes + page - 1) / page * page;
  const size_t span = mapped_ + kHugePage;
  void* p = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) fail("cannot map {} bytes of host memory: {}", bytes, std::strerror(errno));
  auto* base = static_cast<uint8_t*>(p);
  const uintptr_t aligned = ((uintptr_t)base + kHugePage - 1) / kHugePage * kHugePage;
  data_ = reinterpret_cast<uint8_t*>(aligned);
  if (data_ > base) ::munmap(base, (size_t)(data_ - base));
  uint8_t* end = data_ + mapped_;
  if (base + span > end) ::munmap(end, (size_t)(base + span - end));
#ifdef MADV_HUGEPAGE
  if (huge_pages_wanted() && mapped_ >= kHugePage) advised_ = ::madvise(data_, mapped_, MADV_HUGEPAGE) == 0;
#endif
}

namespace {
void release(uint8_t* data, size_t mapped) {
  if (!data) return;
  if (mapped) ::munmap(data, mapped);
  else ::operator delete[](data, std::align_val_t(64));
}
}  // namespace

HugePageBuffer::~HugePageBuffer() { release(data_, mapped_); }

HugePageBuffer::HugePageBuffer(HugePageBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, 0)),
      advised_(std::exchange(other.advised_, false)) {}

HugePageBuffer& HugePageBuffer::operator=(HugePageBuffer&& other) noexcept {
  if (this != &other) {
    release(data_, mapped_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
    advised_ = std::exchange(other.advised_, false);
  }
  return *this;
}

}  // namespace roofline
