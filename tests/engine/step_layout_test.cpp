// The GPU step descriptor's layout (src/backend/cuda/step_layout.h), checked on the CPU: the regions
// follow each other without overlap, each holds what the backend writes into it (max_tokens rows, four
// ints per DeltaNet sequence record, max_tokens sequences' tables of table_blocks blocks), the DeltaNet
// records are 16-byte aligned (the kernels read them as int4), and the capacity covers the last region.
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "backend/cuda/step_layout.h"

namespace roofline::cuda {
namespace {

TEST(StepLayout, RegionsFollowEachOtherAndFitTheCapacity) {
  for (int max_tokens : {1, 2, 7, 8, 64, 513, 2048})
    for (int table_blocks : {1, 3, 130, 4098})
      for (bool swa : {false, true}) {
        SCOPED_TRACE(testing::Message() << max_tokens << " tokens, " << table_blocks << " blocks, swa " << swa);
        const StepLayout l = StepLayout::make(max_tokens, table_blocks, swa);
        const int64_t T = max_tokens;
        // [begin, size) of each region in the order the buffer holds them.
        std::vector<std::pair<int64_t, int64_t>> regions = {{0, kStepHeaderInts}, {l.tokens, T},       {l.positions, T},
                                                            {l.row_seq, T},       {l.logit_rows, T},   {l.attn_rows, T},
                                                            {l.dn_count, 4},      {l.dn_records, 4 * T}, {l.tables, T * table_blocks}};
        if (swa) regions.push_back({l.swa_tables, T * table_blocks});
        for (size_t i = 1; i < regions.size(); ++i)
          EXPECT_GE(regions[i].first, regions[i - 1].first + regions[i - 1].second) << "region " << i << " overlaps the one before";
        EXPECT_EQ(l.capacity, regions.back().first + regions.back().second);
        EXPECT_EQ(l.dn_count % 4, 0) << "DeltaNet count not 16-byte aligned";
        EXPECT_EQ(l.dn_records % 4, 0) << "DeltaNet records not 16-byte aligned";
        EXPECT_GE(kStepHeaderInts, kStepLongSplits + 1) << "the header holds every StepHeader int";
      }
}

TEST(StepLayout, WithoutSlidingLayersTheBufferEndsAfterTheBlockTables) {
  const StepLayout with = StepLayout::make(512, 130, true), without = StepLayout::make(512, 130, false);
  EXPECT_EQ(without.tables, with.tables);  // the same offsets up to the tables either way
  EXPECT_EQ(without.capacity, with.swa_tables);
  EXPECT_EQ(with.capacity - without.capacity, 512 * 130);
  // A backend of no rows still gets room for one.
  EXPECT_EQ(StepLayout::make(0, 4, false).capacity, StepLayout::make(1, 4, false).capacity);
}

}  // namespace
}  // namespace roofline::cuda
