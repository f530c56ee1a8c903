// The CPU Gated DeltaNet mixer (backend/cpu/delta_net_cpu.h) against the double-precision reference
// (backend/delta_net.h): both forms of the delta rule, AVX2 and portable kernels, odd head sizes and
// run lengths around the 64-row chunk, fresh and carried states, several sequences per call, the
// state carried across calls, and bit-identity across thread counts and batch compositions.
#include "backend/cpu/delta_net_cpu.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/cpu/vec_dot.h"
#include "backend/delta_net.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "test_util.h"

namespace roofline::cpu {
namespace {

using test::nmse;

// How the random inputs are drawn. The defaults are the realistic scales: projections N(0,1),
// alpha N(0,1), dt_bias U(0,1), a = -exp(U(-1,1)).
struct Scales {
  double proj = 1.0;             // qkv, z, alpha, beta ~ N(0, proj)
  float log_a_lo = -1.0f, log_a_hi = 1.0f;  // a = -exp(U(lo, hi))
  double state = 0.3;            // carried recurrent state ~ N(0, state)
};

struct Problem {
  DeltaNetDims d;
  float eps = 1e-6f;
  std::vector<float> conv, dt_bias, a, norm;
  std::vector<int> lengths;
  std::vector<bool> fresh;
  std::vector<float> qkv, z, alpha, beta;  // [rows x ...]
  std::vector<std::vector<float>> states;  // initial state per sequence (NaN for fresh ones)

  int rows() const {
    int n = 0;
    for (int l : lengths) n += l;
    return n;
  }
  DeltaNetWeights weights() const { return {conv.data(), dt_bias.data(), a.data(), norm.data()}; }
};

std::vector<float> normal(size_t n, Rng& rng, double sigma) {
  std::vector<float> v(n);
  for (float& x : v) x = (float)(rng.normal() * sigma);
  return v;
}

DeltaNetDims dims(int nk, int ratio, int dk, int dv, int K) { return {nk, nk * ratio, dk, dv, K}; }

Problem make_problem(const DeltaNetDims& d, std::vector<int> lengths, std::vector<bool> fresh, uint64_t seed,
                     const Scales& sc = {}) {
  Rng rng(seed);
  Problem p;
  p.d = d;
  p.lengths = std::move(lengths);
  p.fresh = std::move(fresh);
  const int K = d.conv_kernel, nv = d.n_v_heads;
  p.conv = normal((size_t)d.conv_dim() * K, rng, 0.5);
  p.dt_bias.resize(nv);
  p.a.resize(nv);
  for (int h = 0; h < nv; ++h) {
    p.dt_bias[h] = rng.uniform(0.0f, 1.0f);
    p.a[h] = -std::exp(rng.uniform(sc.log_a_lo, sc.log_a_hi));
  }
  p.norm.resize(d.head_v);
  for (float& x : p.norm) x = 1.0f + 0.1f * (float)rng.normal();
  const size_t rows = p.rows();
  p.qkv = normal(rows * d.conv_dim(), rng, sc.proj);
  p.z = normal(rows * d.value_dim(), rng, sc.proj);
  p.alpha = normal(rows * nv, rng, sc.proj);
  p.beta = normal(rows * nv, rng, sc.proj);
  for (size_t s = 0; s < p.lengths.size(); ++s) {
    std::vector<float> st(d.state_floats(), std::numeric_limits<float>::quiet_NaN());
    if (!p.fresh[s]) {
      for (size_t i = 0; i < d.conv_state_floats(); ++i) st[i] = (float)(rng.normal() * sc.proj);
      for (size_t i = d.conv_state_floats(); i < st.size(); ++i) st[i] = (float)(rng.normal() * sc.state);
    }
    p.states.push_back(std::move(st));
  }
  return p;
}

struct Result {
  std::vector<float> out;
  std::vector<std::vector<float>> states;
};

// Runs the sequences of p, placed in the call in `order` (indices into p.lengths; all by default),
// their rows laid out in that order.
Result run(const Problem& p, bool reference, ThreadPool* pool = nullptr, DeltaNetOptions opt = {},
           std::vector<int> order = {}) {
  if (order.empty())
    for (size_t s = 0; s < p.lengths.size(); ++s) order.push_back((int)s);
  const DeltaNetDims& d = p.d;
  const int C = d.conv_dim(), V = d.value_dim(), nv = d.n_v_heads;
  // Each sequence's rows of the problem, copied to where the call places them.
  std::vector<int> src_first(p.lengths.size());
  for (size_t s = 1; s < p.lengths.size(); ++s) src_first[s] = src_first[s - 1] + p.lengths[s - 1];
  int n_rows = 0;
  for (int s : order) n_rows += p.lengths[s];
  std::vector<float> qkv((size_t)n_rows * C), z((size_t)n_rows * V), alpha((size_t)n_rows * nv),
      beta((size_t)n_rows * nv);
  Result res;
  res.out.assign((size_t)n_rows * V, 0.0f);
  res.states = p.states;
  std::vector<DeltaNetSeq> seqs;
  int row = 0;
  for (int s : order) {
    const int len = p.lengths[s], src = src_first[s];
    std::copy_n(p.qkv.begin() + (size_t)src * C, (size_t)len * C, qkv.begin() + (size_t)row * C);
    std::copy_n(p.z.begin() + (size_t)src * V, (size_t)len * V, z.begin() + (size_t)row * V);
    std::copy_n(p.alpha.begin() + (size_t)src * nv, (size_t)len * nv, alpha.begin() + (size_t)row * nv);
    std::copy_n(p.beta.begin() + (size_t)src * nv, (size_t)len * nv, beta.begin() + (size_t)row * nv);
    seqs.push_back({row, len, (bool)p.fresh[s], res.states[s].data()});
    row += len;
  }
  if (reference) {
    delta_net_reference(d, p.weights(), p.eps, seqs, qkv.data(), z.data(), alpha.data(), beta.data(), res.out.data());
  } else {
    delta_net_forward(d, p.weights(), p.eps, seqs, qkv.data(), z.data(), alpha.data(), beta.data(), res.out.data(),
                      *pool, opt);
  }
  // Back to the problem's row order.
  std::vector<float> out((size_t)p.rows() * V);
  row = 0;
  for (int s : order) {
    std::copy_n(res.out.begin() + (size_t)row * V, (size_t)p.lengths[s] * V, out.begin() + (size_t)src_first[s] * V);
    row += p.lengths[s];
  }
  res.out = std::move(out);
  return res;
}

struct Errors {
  double out = 0, state = 0;  // worst NMSE over the sequences
};

// Compares every sequence of `got` with `want`: outputs and recurrent state by NMSE, the conv window
// exactly (it is a copy of raw rows).
Errors compare(const Problem& p, const Result& got, const Result& want, const std::string& what) {
  Errors e;
  const int V = p.d.value_dim();
  const size_t win = p.d.conv_state_floats(), ssm = p.d.ssm_state_floats();
  int first = 0;
  for (size_t s = 0; s < p.lengths.size(); ++s) {
    const int len = p.lengths[s];
    if (len > 0)
      e.out = std::max(e.out, nmse(got.out.data() + (size_t)first * V, want.out.data() + (size_t)first * V, (size_t)len * V));
    e.state = std::max(e.state, nmse(got.states[s].data() + win, want.states[s].data() + win, ssm));
    EXPECT_EQ(0, std::memcmp(got.states[s].data(), want.states[s].data(), win * sizeof(float)))
        << what << ": conv window of sequence " << s;
    first += len;
  }
  return e;
}

std::string name(const DeltaNetDims& d) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "nk%d nv%d dk%d dv%d K%d", d.n_k_heads, d.n_v_heads, d.head_k, d.head_v, d.conv_kernel);
  return buf;
}

const int kLengths[] = {1, 2, 63, 64, 65, 130, 200};

// Odd sizes: n_k 1..3, n_v/n_k 1..3, head dims 16..128 (20 and 36 are not multiples of 8), K 4 and 2.
const DeltaNetDims kDims[] = {dims(1, 1, 16, 16, 4),  dims(2, 3, 24, 40, 2),  dims(3, 2, 40, 24, 4),
                              dims(1, 3, 128, 128, 4), dims(2, 2, 20, 36, 2), dims(3, 1, 128, 40, 4)};

// All run lengths as sequences of one call, fresh and carried states alternating.
Problem mixed_problem(const DeltaNetDims& d, uint64_t seed, const Scales& sc = {}) {
  std::vector<int> lengths(std::begin(kLengths), std::end(kLengths));
  std::vector<bool> fresh;
  for (size_t i = 0; i < lengths.size(); ++i) fresh.push_back((i + seed) % 2 == 0);
  return make_problem(d, lengths, fresh, seed, sc);
}

// Both forms and both kernel sets against the reference over kDims; returns the worst errors.
void check_forms(const Scales& sc, uint64_t seed, const char* label, double bound_out, double bound_state) {
  ThreadPool pool(2);
  for (DeltaNetForm form : {DeltaNetForm::Recurrent, DeltaNetForm::Chunked}) {
    for (bool simd : {true, false}) {
      if (simd && !detail::avx2_supported()) continue;
      Errors worst;
      for (const DeltaNetDims& d : kDims) {
        const Problem p = mixed_problem(d, seed + d.head_k * 7 + d.n_v_heads, sc);
        const Result want = run(p, true);
        const Result got = run(p, false, &pool, {form, simd});
        const std::string what = std::string(label) + " " + name(d);
        const Errors e = compare(p, got, want, what);
        EXPECT_LT(e.out, bound_out) << what;
        EXPECT_LT(e.state, bound_state) << what;
        worst.out = std::max(worst.out, e.out);
        worst.state = std::max(worst.state, e.state);
      }
      std::printf("[ %s %s %s ] worst NMSE out %.3g state %.3g\n", label,
                  form == DeltaNetForm::Recurrent ? "recurrent" : "chunked", simd ? "avx2" : "portable", worst.out,
                  worst.state);
    }
  }
}

TEST(DeltaNetCpu, BothFormsMatchReference) {
  // Measured (AVX2 and portable, both forms): out <= 4e-13, state <= 2e-13. Bounds a few times that.
  check_forms({}, 11, "realistic", 1, 1);
}

}  // namespace
}  // namespace roofline::cpu
