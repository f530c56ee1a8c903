// HugePageBuffer (core/huge_page_buffer.h): 2 MiB-aligned from 2 MiB up (64-byte below), zero-filled,
// writable to its last byte, and moved without a double release.
#include <gtest/gtest.h>

#include <cstdint>
#include <utility>

#include "core/huge_page_buffer.h"

namespace roofline {
namespace {

TEST(HugePageBuffer, AlignedZeroedWritableAndMovable) {
  for (size_t bytes : {size_t{2}, size_t{4097}, (size_t{2} << 20) + 123, (size_t{5} << 20)}) {
    HugePageBuffer b(bytes);
    ASSERT_NE(b.data(), nullptr);
    EXPECT_EQ(b.size(), bytes);
    EXPECT_EQ((uintptr_t)b.data() % (bytes >= (size_t{2} << 20) ? (size_t{2} << 20) : 64), 0u) << bytes;
    EXPECT_EQ(b.data()[0], 0);
    EXPECT_EQ(b.data()[bytes - 1], 0);
    b.data()[0] = 1;
    b.data()[bytes - 1] = 2;
    HugePageBuffer moved(std::move(b));
    EXPECT_EQ(b.data(), nullptr);
    EXPECT_EQ(moved.data()[0], 1);
    EXPECT_EQ(moved.data()[bytes - 1], 2);
    HugePageBuffer assigned;
    assigned = std::move(moved);
    EXPECT_EQ(assigned.data()[bytes - 1], 2);
  }
  HugePageBuffer empty(0);
  EXPECT_EQ(empty.data(), nullptr);
}

}  // namespace
}  // namespace roofline
