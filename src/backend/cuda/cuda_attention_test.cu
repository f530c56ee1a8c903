// Test hooks of the attention kernels (declared in backend/gpu.h): a step's attention over a paged KV
// cache uploaded from host rows, planned and launched as the backend does it (plan_attention, then
// prefill_attention for the runs and the split-KV kernel for the other rows); the RoPE + K/V store
// prologue (rope_and_store) with the cache read back; and a timing of decode attention.
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cuda/cuda_kernels.cuh"
#include "backend/cuda/cuda_step_pack.cuh"
#include "backend/cuda/cuda_weights.cuh"
#include "backend/gpu.h"
#include "core/rng.h"

namespace roofline {

namespace {

using namespace cuda;

bool quantized_kv(DType t) { return t == DType::Q8_0 || t == DType::Q4_0; }

void check_kv_type(DType t, int kv_dim) {
  if (t != DType::F32 && t != DType::F16 && t != DType::BF16 && !quantized_kv(t))
    fail("KV cache type {} is not supported on the GPU", dtype_name(t));
  if (quantized_kv(t) && kv_dim % 32) fail("KV cache type {} needs rows of whole 32-groups ({} values)", dtype_name(t), kv_dim);
}

// One KV plane pair (values, scales) on the device, from host GGUF rows of `slots` x kv_dim values:
// float types as they are; q8_0/q4_0 blocks {f16 d, 32 int8 | 16 nibble bytes} split into the value
// plane (int8 per value, or 16 bytes per group: low nibble value j, high nibble value j + 16) and the
// f16 scale plane, as cuda_attention.cu reads them.
struct DevicePlane {
  uint8_t* vals = nullptr;
  uint8_t* scales = nullptr;
};
// pattern_fill: instead of rows, every byte 0x20 (small finite values of every type; for timings).
DevicePlane upload_plane(DeviceArena& arena, DType t, const std::vector<uint8_t>& rows, int64_t slots, int kv_dim, bool pattern_fill) {
  const int64_t n = slots * kv_dim;
  if (!pattern_fill && rows.size() != dtype_row_bytes(t, kv_dim) * (size_t)slots)
    fail("KV cache of {} slots of {} {} values: {} bytes given, {} expected", slots, kv_dim, dtype_name(t), rows.size(),
         dtype_row_bytes(t, kv_dim) * (size_t)slots);
  DevicePlane p;
  p.vals = arena.take(kv_values_bytes(t, n));
  if (quantized_kv(t)) p.scales = arena.take(kv_scales_bytes(t, n));
  if (pattern_fill) {
    ROOFLINE_CUDA_CHECK(cudaMemset(p.vals, 0x20, kv_values_bytes(t, n)));
    if (p.scales) ROOFLINE_CUDA_CHECK(cudaMemset(p.scales, 0x20, kv_scales_bytes(t, n)));
    return p;
  }
  if (!quantized_kv(t)) {
    ROOFLINE_CUDA_CHECK(cudaMemcpy(p.vals, rows.data(), rows.size(), cudaMemcpyHostToDevice));
    return p;
  }
  const int per = t == DType::Q8_0 ? 32 : 16, block = 2 + per;
  std::vector<uint8_t> vals((size_t)n / 32 * per), scales((size_t)n / 32 * 2);
  for (int64_t g = 0; g < n / 32; ++g) {
    std::memcpy(&scales[(size_t)g * 2], &rows[(size_t)g * block], 2);
    std::memcpy(&vals[(size_t)g * per], &rows[(size_t)g * block + 2], per);
  }
  ROOFLINE_CUDA_CHECK(cudaMemcpy(p.vals, vals.data(), vals.size(), cudaMemcpyHostToDevice));
  ROOFLINE_CUDA_CHECK(cudaMemcpy(p.scales, scales.data(), scales.size(), cudaMemcpyHostToDevice));
  return p;
}
// The reverse of upload_plane.
void download_plane(const DevicePlane& p, DType t, std::vector<uint8_t>& rows, int64_t slots, int kv_dim) {
  const int64_t n = slots * kv_dim;
  if (!quantized_kv(t)) {
    ROOFLINE_CUDA_CHECK(cudaMemcpy(rows.data(), p.vals, rows.size(), cudaMemcpyDeviceToHost));
    return;
  }
  const int per = t == DType::Q8_0 ? 32 : 16, block = 2 + per;
  std::vector<uint8_t> vals((size_t)n / 32 * per), scales((size_t)n / 32 * 2);
  ROOFLINE_CUDA_CHECK(cudaMemcpy(vals.data(), p.vals, vals.size(), cudaMemcpyDeviceToHost));
  ROOFLINE_CUDA_CHECK(cudaMemcpy(scales.data(), p.scales, scales.size(), cudaMemcpyDeviceToHost));
  for (int64_t g = 0; g < n / 32; ++g) {
    std::memcpy(&rows[(size_t)g * block], &scales[(size_t)g * 2], 2);
    std::memcpy(&rows[(size_t)g * block + 2], &vals[(size_t)g * per], per);
  }
}

KvLayer upload_cache(DeviceArena& arena, const GpuAttentionShape& s, const GpuKvCacheForTest& c, int window, bool pattern_fill) {
  const int64_t slots = (int64_t)c.n_blocks * c.block_size;
  KvLayer kv;
  kv.type_k = c.type_k;
  kv.type_v = c.type_v;
  kv.block_size = c.block_size;
  kv.window = window;
  const DevicePlane k = upload_plane(arena, c.type_k, c.k, slots, s.n_head_kv * s.head_dim_k, pattern_fill);
  const DevicePlane v = upload_plane(arena, c.type_v, c.v, slots, s.n_head_kv * s.head_dim_v, pattern_fill);
  kv.k = k.vals;
  kv.k_scales = k.scales;
  kv.v = v.vals;
  kv.v_scales = v.scales;
  return kv;
}

size_t cache_bytes(const GpuAttentionShape& s, const GpuKvCacheForTest& c) {
  const int64_t slots = (int64_t)c.n_blocks * c.block_size;
  const int64_t nk = slots * s.n_head_kv * s.head_dim_k, nv = slots * s.n_head_kv * s.head_dim_v;
  return kv_values_bytes(c.type_k, nk) + kv_scales_bytes(c.type_k, nk) + kv_values_bytes(c.type_v, nv) +
         kv_scales_bytes(c.type_v, nv) + 4 * 256;
}

// The step descriptor on the device, for n_pad >= step rows (the padding rows at position 0 of
// sequence 0, as the backend pads a decode bucket): header, positions, row_seq, block tables, and the
// rows the split kernel takes when the plan has prefill runs.
struct StepOnDevice {
  DeviceStep step;
  const int* split_rows = nullptr;
};
StepOnDevice upload_step(DeviceArena& arena, const StepDesc& st, int n_pad, const AttentionPlan& plan, const AttentionSpans& spans,
                         int n_blocks) {
  const int n = st.n_tokens();
  if ((int)st.positions.size() != n || (int)st.row_seq.size() != n) fail("step of {} rows: positions and row_seq must have as many", n);
  int stride = 1;
  for (const StepSequence& s : st.sequences) stride = std::max(stride, (int)s.block_table.size());
  if (st.sequences.empty() || st.sequences[0].block_table.empty()) fail("a step needs a sequence with a block");
  for (int r = 0; r < n; ++r) {
    if (st.row_seq[r] < 0 || st.row_seq[r] >= (int)st.sequences.size()) fail("row {} names sequence {} of {}", r, st.row_seq[r], st.sequences.size());
    if (st.positions[r] < 0) fail("row {} has position {}", r, st.positions[r]);
  }
  for (const StepSequence& s : st.sequences)
    for (int32_t b : s.block_table)
      if (b < 0 || b >= n_blocks) fail("block table names block {} of {}", b, n_blocks);
  // A compact layout of its own (the kernels read the step through DeviceStep's pointers only).
  std::vector<int> h(kStepHeaderInts + 2 * (size_t)n_pad + st.sequences.size() * stride + (size_t)n_pad, 0);
  h[kStepRealRows] = n;
  h[kStepLogitRows] = 0;
  h[kStepSplitLen] = plan.split_len;
  h[kStepMinSpan] = plan.min_span;
  h[kStepSpanSplits] = spans.splits;
  h[kStepLongSplits] = spans.long_splits;
  h[kStepMaxSpan] = spans.max_span;
  int* positions = h.data() + kStepHeaderInts;
  int* row_seq = positions + n_pad;
  int* tables = row_seq + n_pad;
  int* rows = tables + st.sequences.size() * stride;
  for (int r = 0; r < n; ++r) {
    positions[r] = st.positions[r];
    row_seq[r] = st.row_seq[r];
  }
  for (size_t s = 0; s < st.sequences.size(); ++s)
    std::copy(st.sequences[s].block_table.begin(), st.sequences[s].block_table.end(), tables + s * stride);
  std::copy(plan.split_rows.begin(), plan.split_rows.end(), rows);
  int* d = reinterpret_cast<int*>(arena.take(h.size() * 4));
  ROOFLINE_CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  StepOnDevice out;
  out.step.header = d;
  out.step.tokens = d + kStepHeaderInts;  // not read by the attention kernels
  out.step.positions = d + kStepHeaderInts;
  out.step.row_seq = d + kStepHeaderInts + n_pad;
  out.step.logit_rows = d + kStepHeaderInts;
  out.step.block_tables = d + (tables - h.data());
  out.step.table_stride = stride;
  out.split_rows = plan.runs.empty() ? nullptr : d + (rows - h.data());
  return out;
}

// Every row's keys lie in its sequence's block table.
void check_tables(const StepDesc& st, int block_size) {
  if (block_size < 1) fail("KV block size {}", block_size);
  if ((int)st.row_seq.size() != st.n_tokens() || (int)st.positions.size() != st.n_tokens())
    fail("step of {} rows: positions and row_seq must have as many", st.n_tokens());
  for (int r = 0; r < st.n_tokens(); ++r) {
    if (st.row_seq[r] < 0 || st.row_seq[r] >= (int)st.sequences.size()) fail("row {} names sequence {} of {}", r, st.row_seq[r], st.sequences.size());
    const StepSequence& s = st.sequences[(size_t)st.row_seq[r]];
    if (st.positions[r] / block_size >= (int)s.block_table.size())
      fail("row {} at position {} is past its sequence's {} blocks", r, st.positions[r], s.block_table.size());
  }
}

size_t step_ints(const StepDesc& st, int n_pad) {
  size_t stride = 1;
  for (const StepSequence& s : st.sequences) stride = std::max(stride, s.block_table.size());
  return 8 + 3 * (size_t)n_pad + st.sequences.size() * stride;
}

int clamp_key_tile(int v) { return std::max(32, std::min(1024, v / 32 * 32)); }

// The attention launches of one layer step as the backend issues them (attention_block).
struct AttentionRig {
  DeviceArena arena;
  KvLayer kv;
  StepOnDevice dstep;
  AttentionPlan plan;
  PrefillScratch prefill;
  float *q = nullptr, *out = nullptr, *partial = nullptr;
  ActQ8 act;  // the output's int8 form (with_act)
  int* combine_counters = nullptr;  // decode steps' combine in the split kernel
  int n_pad = 0, max_splits = 1;
  cublasHandle_t cublas = nullptr;

  ~AttentionRig() { release(); }
  void release() {  // before its stream is destroyed
    if (cublas) cublasDestroy(cublas);
    cublas = nullptr;
  }
  void run(const GpuAttentionShape& s, float scale, cudaStream_t stream, bool combine_in_split) {
    prefill_attention(cublas, dstep.step, plan.runs, q, n_pad, kv, s.n_head, s.n_head_kv, s.head_dim_k, s.head_dim_v, scale,
                      prefill, out, stream);
    const int n_split_rows = plan.runs.empty() ? n_pad : (int)plan.split_rows.size();
    attention(dstep.step, q, kv, n_split_rows, s.n_head, s.n_head_kv, s.head_dim_k, s.head_dim_v, scale, plan.splits, partial, out,
              act, dstep.split_rows, stream, combine_in_split ? combine_counters : nullptr, plan.split_heads, plan.grid_splits);
  }
};

void build_rig(AttentionRig& rig, const GpuAttentionShape& s, const GpuKvCacheForTest& c, int window, const StepDesc& st,
               int key_tile, bool pattern_fill, cudaStream_t stream, bool with_act = false) {
  if (s.n_head <= 0 || s.n_head_kv <= 0 || s.n_head % s.n_head_kv) fail("{} query heads over {} KV heads", s.n_head, s.n_head_kv);
  check_kv_type(c.type_k, s.n_head_kv * s.head_dim_k);
  check_kv_type(c.type_v, s.n_head_kv * s.head_dim_v);
  check_tables(st, c.block_size);
  const int n = st.n_tokens();
  rig.n_pad = decode_bucket(n);
  int n_ctx = 1;
  for (int p : st.positions) n_ctx = std::max(n_ctx, p + 1);
  const AttentionSpans spans = attention_spans(s.n_head_kv);
  rig.max_splits = attention_max_splits(n_ctx, spans.min_span, spans.splits);
  rig.plan = plan_attention(st, rig.max_splits, spans,
                            prefill_min_keys(flash_prefill_fits(c.type_k, c.type_v, s.head_dim_k, s.head_dim_v)));
  const int q_dim = s.n_head * s.head_dim_k, o_dim = s.n_head * s.head_dim_v;
  const int kv_dim = std::max(s.n_head_kv * s.head_dim_k, s.n_head_kv * s.head_dim_v);
  const int tile = key_tile > 0 ? clamp_key_tile(key_tile) : prefill_key_tile();
  const size_t score_floats = (size_t)s.n_head * tile * 16;  // chunks of 16 rows of a run
  const size_t partial = attention_partial_floats(8, s.n_head, s.head_dim_v, rig.max_splits);
  const size_t rows = (size_t)rig.n_pad;
  rig.arena.reserve(cache_bytes(s, c) + rows * (q_dim + o_dim) * 4 + partial * 4 + rows * q_dim * 2 + (size_t)2 * tile * kv_dim * 2 +
                    score_floats * 4 + 2 * rows * s.n_head * 4 + rows * o_dim * 4 + 17 * 256 + step_ints(st, rig.n_pad) * 4 +
                    attention_combine_counters(s.n_head_kv) * 4 + (with_act ? rows * o_dim * 3 + 3 * 256 : 0));
  rig.kv = upload_cache(rig.arena, s, c, window, pattern_fill);
  rig.dstep = upload_step(rig.arena, st, rig.n_pad, rig.plan, spans, c.n_blocks);
  auto take_f = [&](size_t k) { return reinterpret_cast<float*>(rig.arena.take(std::max<size_t>(1, k) * 4)); };
  rig.q = take_f(rows * q_dim);
  rig.out = take_f(rows * o_dim);
  rig.partial = take_f(partial);
  rig.combine_counters = reinterpret_cast<int*>(rig.arena.take(attention_combine_counters(s.n_head_kv) * 4));
  if (with_act) {
    rig.act.q = reinterpret_cast<int8_t*>(rig.arena.take(rows * o_dim));
    rig.act.d = take_f(rows * o_dim / 32);
    rig.act.s = take_f(rows * o_dim / 32);
  }
  ROOFLINE_CUDA_CHECK(cudaMemset(rig.combine_counters, 0, attention_combine_counters(s.n_head_kv) * 4));
  rig.prefill.key_tile = tile;
  rig.prefill.q16 = reinterpret_cast<__half*>(rig.arena.take(rows * q_dim * 2));
  rig.prefill.kv16 = reinterpret_cast<__half*>(rig.arena.take((size_t)2 * tile * kv_dim * 2));
  rig.prefill.scores = take_f(score_floats);
  rig.prefill.score_floats = score_floats;
  rig.prefill.m_state = take_f(rows * s.n_head);
  rig.prefill.l_state = take_f(rows * s.n_head);
  rig.prefill.o_acc = take_f(rows * o_dim);
  if (cublasCreate(&rig.cublas) != CUBLAS_STATUS_SUCCESS) fail("cuBLAS could not be initialized");
  cublasSetStream(rig.cublas, stream);
  ROOFLINE_CUDA_CHECK(cudaDeviceSynchronize());  // the uploads (legacy stream) before the kernels (a non-blocking one)
}

}  // namespace

std::vector<float> gpu_attention_for_test(const GpuAttentionShape& s, const GpuKvCacheForTest& cache, int window, float scale,
                                          const StepDesc& st, const std::vector<float>& q, int key_tile, bool combine_in_split,
                                          int device, std::vector<uint8_t>* act) {
  ROOFLINE_CUDA_CHECK(cudaSetDevice(device));
  const int n = st.n_tokens();
  const size_t q_dim = (size_t)s.n_head * s.head_dim_k, o_dim = (size_t)s.n_head * s.head_dim_v;
  if (n < 1 || q.size() != (size_t)n * q_dim) fail("gpu_attention_for_test: {} query values for {} rows of {}", q.size(), n, q_dim);
  cudaStream_t stream;
  ROOFLINE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  AttentionRig rig;
  if (act && s.head_dim_v % 32 != 0) fail("gpu_attention_for_test: an int8 output needs heads of whole groups of 32, not {}", s.head_dim_v);
  build_rig(rig, s, cache, window, st, key_tile, false, stream, act != nullptr);
  // Padding rows' queries are NaN (a kernel reading them would put NaN in their outputs, which must
  // come back zero); the output starts as NaN everywhere, so a row no kernel writes shows.
  std::vector<float> qh((size_t)rig.n_pad * q_dim, std::numeric_limits<float>::quiet_NaN());
  std::copy(q.begin(), q.end(), qh.begin());
  ROOFLINE_CUDA_CHECK(cudaMemcpy(rig.q, qh.data(), qh.size() * 4, cudaMemcpyHostToDevice));
  std::vector<float> out((size_t)rig.n_pad * o_dim), again(out.size());
  // Twice (the combine's counters must be back at zero after each launch): the same bits.
  for (std::vector<float>* dst : {&out, &again}) {
    ROOFLINE_CUDA_CHECK(cudaMemsetAsync(rig.out, 0xff, (size_t)rig.n_pad * o_dim * 4, stream));
    rig.run(s, scale, stream, combine_in_split);
    ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream));
    ROOFLINE_CUDA_CHECK(cudaGetLastError());
    ROOFLINE_CUDA_CHECK(cudaMemcpy(dst->data(), rig.out, dst->size() * 4, cudaMemcpyDeviceToHost));
  }
  if (std::memcmp(out.data(), again.data(), out.size() * 4) != 0) fail("gpu_attention_for_test: a second run gave other values");
  if (act) {  // the real rows' int8 values, then their groups' d and s
    const size_t vals = (size_t)n * o_dim, groups = vals / 32;
    act->assign(vals + 8 * groups, 0);
    ROOFLINE_CUDA_CHECK(cudaMemcpy(act->data(), rig.act.q, vals, cudaMemcpyDeviceToHost));
    ROOFLINE_CUDA_CHECK(cudaMemcpy(act->data() + vals, rig.act.d, groups * 4, cudaMemcpyDeviceToHost));
    ROOFLINE_CUDA_CHECK(cudaMemcpy(act->data() + vals + 4 * groups, rig.act.s, groups * 4, cudaMemcpyDeviceToHost));
  }
  rig.release();
  ROOFLINE_CUDA_CHECK(cudaStreamDestroy(stream));
  for (size_t i = (size_t)n * o_dim; i < out.size(); ++i)
    if (out[i] != 0.0f) fail("gpu_attention_for_test: padding row {} of the decode bucket came back {}", i / o_dim, out[i]);
  out.resize((size_t)n * o_dim);
  return out;
}

void gpu_rope_store_for_test(const GpuAttentionShape& s, const GpuRopeForTest& rope, const StepDesc& st, std::vector<float>& q,
                             std::vector<float>& k, const std::vector<float>& v, GpuKvCacheForTest& cache, int device) {
  ROOFLINE_CUDA_CHECK(cudaSetDevice(device));
  const int n = st.n_tokens();
  const size_t q_dim = (size_t)s.n_head * s.head_dim_k, kd = (size_t)s.n_head_kv * s.head_dim_k, vd = (size_t)s.n_head_kv * s.head_dim_v;
  if (n < 1 || q.size() != (size_t)n * q_dim || k.size() != (size_t)n * kd || v.size() != (size_t)n * vd)
    fail("gpu_rope_store_for_test: q, k, v must hold {} rows of {}, {}, {} values", n, q_dim, kd, vd);
  if (rope.n_rot < 2 || rope.n_rot % 2 || rope.n_rot > s.head_dim_k) fail("gpu_rope_store_for_test: n_rot {} of head {}", rope.n_rot, s.head_dim_k);
  check_kv_type(cache.type_k, (int)kd);
  check_kv_type(cache.type_v, (int)vd);
  check_tables(st, cache.block_size);
  cudaStream_t stream;
  ROOFLINE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int n_pad = decode_bucket(n);
  DeviceArena arena;
  arena.reserve(cache_bytes(s, cache) + (size_t)n_pad * (q_dim + kd + vd) * 4 + (3 * (size_t)s.head_dim_k + rope.n_rot) * 4 +
                step_ints(st, n_pad) * 4 + (size_t)n_pad * rope.n_rot * 4 + 17 * 256);
  const KvLayer kv = upload_cache(arena, s, cache, 0, false);
  AttentionPlan no_plan;  // the prologue reads the header's row count, positions and tables only
  const StepOnDevice dstep = upload_step(arena, st, n_pad, no_plan, AttentionSpans{}, cache.n_blocks);
  auto upload_rows = [&](const std::vector<float>& src, size_t width) {
    // Padding rows hold large values: a kernel storing them would overwrite sequence 0's position 0.
    std::vector<float> h((size_t)n_pad * width, 1e4f);
    std::copy(src.begin(), src.end(), h.begin());
    float* d = reinterpret_cast<float*>(arena.take(h.size() * 4));
    ROOFLINE_CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
    return d;
  };
  auto upload_vec = [&](const float* src, size_t count) -> float* {
    if (!src) return nullptr;
    float* d = reinterpret_cast<float*>(arena.take(count * 4));
    ROOFLINE_CUDA_CHECK(cudaMemcpy(d, src, count * 4, cudaMemcpyHostToDevice));
    return d;
  };
  float* dq = upload_rows(q, q_dim);
  float* dk = upload_rows(k, kd);
  float* dv = upload_rows(v, vd);
  const float* q_norm = upload_vec(rope.q_norm, (size_t)s.head_dim_k);
  const float* k_norm = upload_vec(rope.k_norm, (size_t)s.head_dim_k);
  const float* factors = upload_vec(rope.factors, (size_t)rope.n_rot / 2);
  float* table = rope.table ? reinterpret_cast<float*>(arena.take((size_t)n_pad * rope.n_rot * 4)) : nullptr;
  ROOFLINE_CUDA_CHECK(cudaDeviceSynchronize());
  if (table) rope_table(dstep.step, n_pad, factors, rope.n_rot, rope.freq_base, rope.freq_scale, table, stream);
  rope_and_store(dstep.step, dq, dk, dv, q_norm, k_norm, factors, n_pad, s.n_head, s.n_head_kv, s.head_dim_k, s.head_dim_v, rope.n_rot,
                 rope.neox, rope.freq_base, rope.freq_scale, rope.eps, kv, stream, table);
  ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream));
  ROOFLINE_CUDA_CHECK(cudaGetLastError());
  ROOFLINE_CUDA_CHECK(cudaMemcpy(q.data(), dq, q.size() * 4, cudaMemcpyDeviceToHost));
  ROOFLINE_CUDA_CHECK(cudaMemcpy(k.data(), dk, k.size() * 4, cudaMemcpyDeviceToHost));
  const int64_t slots = (int64_t)cache.n_blocks * cache.block_size;
  download_plane({kv.k, kv.k_scales}, cache.type_k, cache.k, slots, (int)kd);
  download_plane({kv.v, kv.v_scales}, cache.type_v, cache.v, slots, (int)vd);
  ROOFLINE_CUDA_CHECK(cudaStreamDestroy(stream));
}

double gpu_attention_decode_time_for_test(const GpuAttentionShape& s, DType type_k, DType type_v, int n_seqs, int depth, int reps,
                                          int device) {
  ROOFLINE_CUDA_CHECK(cudaSetDevice(device));
  if (n_seqs < 1 || depth < 1) fail("gpu_attention_decode_time_for_test: {} sequences of depth {}", n_seqs, depth);
  constexpr int kBlock = 16;
  const int blocks_per_seq = (depth + kBlock - 1) / kBlock;
  // Each sequence one decode row at position depth - 1 (depth keys), its blocks interleaved with the
  // other sequences' (block b of sequence i is block b * n_seqs + i) as a server's would be.
  StepDesc st;
  for (int i = 0; i < n_seqs; ++i) {
    StepSequence sq;
    sq.n_past = depth - 1;
    sq.n_new = 1;
    sq.first_token = i;
    for (int b = 0; b < blocks_per_seq; ++b) sq.block_table.push_back(b * n_seqs + i);
    st.sequences.push_back(sq);
    st.tokens.push_back(0);
    st.positions.push_back(depth - 1);
    st.row_seq.push_back(i);
  }
  // The cache's planes hold a byte pattern (upload_plane); the time does not depend on the values.
  GpuKvCacheForTest c;
  c.type_k = type_k;
  c.type_v = type_v;
  c.block_size = kBlock;
  c.n_blocks = blocks_per_seq * n_seqs;
  cudaStream_t stream;
  ROOFLINE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  AttentionRig rig;
  build_rig(rig, s, c, 0, st, 0, true, stream);
  Rng rng(5);
  std::vector<float> qh((size_t)rig.n_pad * s.n_head * s.head_dim_k);
  for (float& x : qh) x = (float)rng.normal();
  ROOFLINE_CUDA_CHECK(cudaMemcpy(rig.q, qh.data(), qh.size() * 4, cudaMemcpyHostToDevice));
  const float scale = 1.0f / std::sqrt((float)s.head_dim_k);
  rig.run(s, scale, stream, true);  // warm-up outside the capture
  ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream));
  double us = 0;
  if (reps > 0) us = time_in_graph_us(stream, reps, [&] { rig.run(s, scale, stream, true); });
  ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream));
  ROOFLINE_CUDA_CHECK(cudaGetLastError());
  rig.release();
  ROOFLINE_CUDA_CHECK(cudaStreamDestroy(stream));
  return us;
}

}  // namespace roofline
