// CPU paged attention (backend/cpu/cpu_ops.h): against a double-precision reference that reads the
// dequantized cache, for two sequences whose rows span several 16-row tiles, scattered block tables, F16
// and Q8_0 caches, full and sliding-window attention; and each row computed alone in a step of its own
// gives the same bits as in the whole step (batch invariance).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "backend/attention_reference.h"
#include "backend/cpu/cpu_ops.h"
#include "core/rng.h"
#include "formats/quant_ref.h"

namespace roofline::cpu {
namespace {

constexpr int kHeads = 6, kHeadsKv = 2, kBlock = 8, kBlocks = 24;
int kDimK = 64, kDimV = 32;  // set per case

struct Cache {
  DType type;
  std::vector<uint8_t> k, v;
  KvLayerView view() {
    KvLayerView kv;
    kv.k = k.data();
    kv.v = v.data();
    kv.type_k = kv.type_v = type;
    kv.k_row_bytes = dtype_row_bytes(type, kHeadsKv * kDimK);
    kv.v_row_bytes = dtype_row_bytes(type, kHeadsKv * kDimV);
    kv.block_size = kBlock;
    return kv;
  }
};

Cache random_cache(DType type, Rng& rng) {
  Cache c{type, {}, {}};
  const int slots = kBlock * kBlocks;
  std::vector<float> k((size_t)slots * kHeadsKv * kDimK), v((size_t)slots * kHeadsKv * kDimV);
  for (float& x : k) x = (float)rng.normal();
  for (float& x : v) x = (float)rng.normal();
  c.k.resize(dtype_row_bytes(type, kHeadsKv * kDimK) * slots);
  c.v.resize(dtype_row_bytes(type, kHeadsKv * kDimV) * slots);
  quantize_rows_ref(type, k.data(), c.k.data(), slots, kHeadsKv * kDimK);
  quantize_rows_ref(type, v.data(), c.v.data(), slots, kHeadsKv * kDimV);
  return c;
}

// Sequence A: 100 cached positions and 37 new rows (tiles of 16, 16, 5; its keys span three blocks of 64 and
// groups of 16 with tails); sequence B: 3 new rows. Their blocks are interleaved out of order.
StepDesc two_sequences() {
  StepDesc st;
  StepSequence a, b;
  a.n_past = 100;
  a.n_new = 37;
  a.block_table = {9, 2, 14, 0, 7, 11, 23, 1, 18, 3, 20, 6, 12, 16, 4, 21, 8, 13};  // positions 0..136
  b.n_new = 3;
  b.first_token = 37;
  b.block_table = {5};
  st.sequences = {a, b};
  for (int i = 0; i < 37; ++i) {
    st.tokens.push_back(0);
    st.positions.push_back(100 + i);
    st.row_seq.push_back(0);
  }
  for (int i = 0; i < 3; ++i) {
    st.tokens.push_back(0);
    st.positions.push_back(i);
    st.row_seq.push_back(1);
  }
  return st;
}

// The float64 reference (attention_reference.h) over the whole cache dequantized.
std::vector<double> reference(KvLayerView kv, const StepDesc& st, const std::vector<float>& q, float scale, int window) {
  const int slots = kBlock * kBlocks;
  std::vector<float> k((size_t)slots * kHeadsKv * kDimK), v((size_t)slots * kHeadsKv * kDimV);
  dequantize_rows_ref(kv.type_k, kv.k, k.data(), slots, kHeadsKv * kDimK);
  dequantize_rows_ref(kv.type_v, kv.v, v.data(), slots, kHeadsKv * kDimV);
  return test::attention_reference(st, {kHeads, kHeadsKv, kDimK, kDimV}, q.data(), k.data(), v.data(), kBlock, scale, window);
}

// Head dimensions (K, V): 64/32 takes the portable loops everywhere; 128/128 and 64/64 the AVX-512 ones
// where the CPU has them (and the portable ones under ROOFLINE_CPU_ISA=avx2).
TEST(CpuAttention, MatchesTheReferenceAndEachRowAlone) {
  ThreadPool pool(2);
  for (auto [dk, dv] : {std::pair{64, 32}, std::pair{128, 128}, std::pair{64, 64}}) {
    kDimK = dk;
    kDimV = dv;
    for (DType type : {DType::F16, DType::Q8_0}) {
      for (int window : {0, 7}) {
        SCOPED_TRACE(dtype_name(type) + " window " + std::to_string(window) + " dims " + std::to_string(dk) + "/" +
                     std::to_string(dv));
        Rng rng(31 + (uint64_t)window);
        Cache cache = random_cache(type, rng);
        const KvLayerView kv = cache.view();
        const StepDesc st = two_sequences();
        std::vector<float> q((size_t)st.n_tokens() * kHeads * kDimK);
        for (float& x : q) x = (float)rng.normal();
        const float scale = 1.0f / std::sqrt((float)kDimK);
        std::vector<float> out((size_t)st.n_tokens() * kHeads * kDimV);
        attention(kv, st, q.data(), out.data(), kHeads, kHeadsKv, kDimK, kDimV, scale, pool, window);
        const std::vector<double> ref = reference(kv, st, q, scale, window);
        EXPECT_LT(test::nmse_vs_reference(out, ref), 1e-12);
        for (int r = 0; r < st.n_tokens(); ++r) {
          StepDesc one;
          one.tokens = {0};
          one.positions = {st.positions[r]};
          one.row_seq = {0};
          one.sequences = {st.sequences[st.row_seq[r]]};
          one.sequences[0].first_token = 0;
          one.sequences[0].n_new = 1;
          one.sequences[0].n_past = st.positions[r];
          std::vector<float> alone((size_t)kHeads * kDimV);
          attention(kv, one, q.data() + (size_t)r * kHeads * kDimK, alone.data(), kHeads, kHeadsKv, kDimK, kDimV, scale,
                    pool, window);
          ASSERT_EQ(std::memcmp(alone.data(), out.data() + (size_t)r * kHeads * kDimV, alone.size() * sizeof(float)), 0)
              << "row " << r;
        }
      }
    }
  }
}

}  // namespace
}  // namespace roofline::cpu
