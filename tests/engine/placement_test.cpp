// The layer split over several GPUs as pure functions: proportional contiguous ranges, the largest
// offload that fits every GPU's budget, and the -ts / --vram-limit lists.
#include <gtest/gtest.h>

#include "core/error.h"
#include "engine/placement.h"

using namespace roofline;

TEST(PlacementTest, SplitUnitsFollowsProportionsAndKeepsTheTotal) {
  EXPECT_EQ(split_units(65, {1, 1}), (std::vector<int>{33, 32}));
  EXPECT_EQ(split_units(65, {3, 1}), (std::vector<int>{49, 16}));
  EXPECT_EQ(split_units(10, {0, 1}), (std::vector<int>{0, 10}));
  EXPECT_EQ(split_units(3, {1, 1, 1, 1}), (std::vector<int>{1, 1, 0, 1}));
  EXPECT_EQ(split_units(0, {1, 2}), (std::vector<int>{0, 0}));
  for (int units = 0; units < 70; ++units) {
    const auto c = split_units(units, {0.7, 0.2, 0.1});
    EXPECT_EQ(c[0] + c[1] + c[2], units);
  }
  EXPECT_THROW(split_units(4, {}), Error);
  EXPECT_THROW(split_units(4, {0, 0}), Error);
  EXPECT_THROW(split_units(4, {-1, 2}), Error);
}

TEST(PlacementTest, GpuRangesAreContiguousFromTheBackWithTheOutputOnTheLastGpu) {
  // 64 layers + output = 65 units, 40 offloaded over two GPUs 1:1.
  const auto r = gpu_ranges(65, 40, {1, 1});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].gpu, 0);
  EXPECT_EQ(r[0].first_unit, 25);
  EXPECT_EQ(r[0].end_unit, 45);
  EXPECT_EQ(r[1].gpu, 1);
  EXPECT_EQ(r[1].first_unit, 45);
  EXPECT_EQ(r[1].end_unit, 65);  // unit 64 is the output
  // A GPU with no share is skipped.
  const auto s = gpu_ranges(65, 65, {0, 1});
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].gpu, 1);
  EXPECT_EQ(s[0].first_unit, 0);
}

TEST(PlacementTest, FitUnitsFindsTheLargestOffloadThatFitsEveryGpu) {
  // Every unit costs 1 GB on any GPU.
  auto cost = [](int, int first, int end) { return (end - first) * 1e9; };
  EXPECT_EQ(fit_units(65, {1}, {100e9}, cost), 65);
  EXPECT_EQ(fit_units(65, {1}, {20.5e9}, cost), 20);
  // Two GPUs 1:1 with 24 GB each: 48 units (24 + 24) fit, 49 would put 25 on the first.
  EXPECT_EQ(fit_units(65, {1, 1}, {24e9, 24e9}, cost), 48);
  // Proportions 3:1 against budgets 30 and 30: the first GPU limits it (40 units -> 30 + 10).
  EXPECT_EQ(fit_units(65, {3, 1}, {30e9, 30e9}, cost), 40);
  // The output unit is expensive: it must fit on the last GPU.
  auto heavy_output = [](int, int first, int end) { return (end - first) * 1e9 + (end == 65 ? 50e9 : 0); };
  // Only one unit fits: split 1:0 it lands (the output unit) on the first GPU, which has room.
  EXPECT_EQ(fit_units(65, {1, 1}, {100e9, 40e9}, heavy_output), 1);
  EXPECT_EQ(fit_units(65, {1, 1}, {40e9, 40e9}, heavy_output), 0);
  EXPECT_EQ(fit_units(65, {1, 1}, {100e9, 60e9}, heavy_output), 21);  // 11 + 10: the last GPU holds 10 + output
}

TEST(PlacementTest, ParsesProportionLists) {
  EXPECT_EQ(parse_proportions("3,1", "-ts"), (std::vector<double>{3, 1}));
  EXPECT_EQ(parse_proportions("0.5/0.5", "-ts"), (std::vector<double>{0.5, 0.5}));
  EXPECT_EQ(parse_proportions("24", "--vram-limit"), (std::vector<double>{24}));
  EXPECT_TRUE(parse_proportions("", "-ts").empty());
  for (const char* bad : {"a", "1,,2", "-1,2", "0,0", "1,", "inf"}) EXPECT_THROW(parse_proportions(bad, "-ts"), Error) << bad;
}
