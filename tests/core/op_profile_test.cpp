// OpProfile (core/op_profile.h): the per-op table both step profilers print, averaged per step, ops by time.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "core/op_profile.h"

namespace roofline {
namespace {

std::string printed(const OpProfile& p, double bw) {
  std::FILE* f = std::tmpfile();
  p.print("TEST", bw, f);
  std::rewind(f);
  std::string text;
  char buf[512];
  while (std::fgets(buf, sizeof buf, f)) text += buf;
  std::fclose(f);
  return text;
}

TEST(OpProfile, AveragesPerStepAndSortsOpsByTime) {
  OpProfile p;
  for (int step = 0; step < 2; ++step) {
    p.steps[1] += 1;
    p.add(1, "norm", 10.0, 0);
    p.add(1, "product", 100.0, 1e6);  // 1 MB in 100 us: 10 GB/s
    p.add(1, "product", 100.0, 1e6);
  }
  p.add(8, "ignored", 5.0, 0);  // a step size with no step counted is not printed
  const std::string t = printed(p, 20.0);
  EXPECT_NE(t.find("TEST per-op time of one step of 1 rows (average over 2 steps)"), std::string::npos) << t;
  EXPECT_NE(t.find("| product | 2 | 200.0 | 95.2% | 2.0 | 10.0 | 50% |"), std::string::npos) << t;
  EXPECT_NE(t.find("| norm | 1 | 10.0 | 4.8% | 0.0 | 0.0 | 0% |"), std::string::npos) << t;
  EXPECT_LT(t.find("| product"), t.find("| norm"));
  EXPECT_NE(t.find("| total | | 210.0 | 100% | 2.0 | 9.5 | 48% |"), std::string::npos) << t;
  EXPECT_EQ(t.find("ignored"), std::string::npos) << t;
}

}  // namespace
}  // namespace roofline
