// The per-op time tables both backends' step profilers print (bench --profile): per step size (rows in
// the step), each op's calls, average time per step, share of the step and, for weight ops, the bytes read
// and the bandwidth reached against a reference figure.
#pragma once

#include <cstdio>
#include <map>
#include <string>

namespace roofline {

struct OpTotals {
  double calls = 0, us = 0, bytes = 0;
};

struct OpProfile {
  std::map<int, std::map<std::string, OpTotals>> totals;  // step rows -> op -> totals
  std::map<int, int> steps;                               // step rows -> steps profiled

  // Adds one call of `op` in a step of `rows` rows.
  void add(int rows, const std::string& op, double us, double bytes) {
    OpTotals& t = totals[rows][op];
    t.calls += 1;
    t.us += us;
    t.bytes += bytes;
  }
  // One table per step size, ops by time; `title` names the timing ("GPU (CUDA graphs off)", ...),
  // `bw_gbps` is the bandwidth the GB/s column is compared with (0: none).
  void print(const char* title, double bw_gbps, std::FILE* out = stderr) const;
};

}  // namespace roofline
