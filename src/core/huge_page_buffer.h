// A host buffer for data that is streamed over and over (the CPU's packed weights). From 2 MiB up: an
// anonymous mapping that starts on a 2 MiB boundary and, where transparent huge pages are on ("madvise"
// mode included), is advised to use them, so a stream of weights crosses a 2 MiB page where it crossed 512
// small ones (fewer TLB walks). Smaller buffers (a MoE model's thousands of expert matrices) come from the
// heap, 64-byte aligned, so they never count against the process's limit on mappings.
// ROOFLINE_HUGE_PAGES=0 leaves the advice out (the same mapping).
#pragma once

#include <cstddef>
#include <cstdint>

namespace roofline {

class HugePageBuffer {
 public:
  HugePageBuffer() = default;
  // Zero-filled, writable; throws (one line) when the mapping fails.
  explicit HugePageBuffer(size_t bytes);
  ~HugePageBuffer();
  HugePageBuffer(HugePageBuffer&& other) noexcept;
  HugePageBuffer& operator=(HugePageBuffer&& other) noexcept;
  HugePageBuffer(const HugePageBuffer&) = delete;
  HugePageBuffer& operator=(const HugePageBuffer&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool advised() const { return advised_; }  // huge pages were asked for

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;    // bytes asked for
  size_t mapped_ = 0;  // bytes mapped from data_ (size_ rounded up to the page); 0: from the heap
  bool advised_ = false;
};

}  // namespace roofline
