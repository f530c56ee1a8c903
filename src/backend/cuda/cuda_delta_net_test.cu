// Test hooks of the DeltaNet kernels (declared in backend/gpu.h): the mixer over host data, padded and
// optionally graph-captured like a decode bucket, and a timing of the launches on random data.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cuda/cuda_delta_net.cuh"
#include "backend/cuda/cuda_weights.cuh"
#include "backend/gpu.h"
#include "core/rng.h"

namespace roofline {

namespace {

using namespace cuda;

// Device copies of everything one layer step needs, for up to `rows` rows and `cells` state cells.
struct DeltaNetRig {
  DeviceArena arena;
  DeltaNetLayerDev layer;
  DeltaNetScratch scratch;
  float *qkv = nullptr, *z = nullptr, *alpha = nullptr, *beta = nullptr, *out = nullptr;
  ActQ8 act;
  DeltaNetSeqDev* recs = nullptr;
  int* count = nullptr;
  int64_t cell_stride = 0;

  DeltaNetRig(const DeltaNetDims& d, int rows, int cells, int max_seqs) {
    const std::string why = delta_net_unsupported(d);
    if (!why.empty()) fail("{}", why);
    // A padded stride (a multiple of 4 floats, not of the state size) so a wrong stride shows.
    cell_stride = ((int64_t)d.state_floats() + 3) / 4 * 4 + 12;
    const size_t C = d.conv_dim(), VD = d.value_dim(), nv = d.n_v_heads;
    const size_t scratch_floats = delta_net_scratch_floats(d, rows, true);
    const size_t floats = C * d.conv_kernel + 2 * nv + d.head_v + (size_t)cells * cell_stride + scratch_floats +
                          (size_t)rows * (C + 2 * VD + 2 * nv) + 2 * (size_t)rows * (VD / 32 + 1);
    arena.reserve(floats * 4 + (size_t)rows * VD + (size_t)max_seqs * sizeof(DeltaNetSeqDev) + 64 * 256);
    auto take = [&](size_t n) { return reinterpret_cast<float*>(arena.take(std::max<size_t>(1, n) * 4)); };
    layer.conv = take(C * d.conv_kernel);
    layer.dt_bias = take(nv);
    layer.a = take(nv);
    layer.norm = take(d.head_v);
    layer.state = take((size_t)cells * cell_stride);
    layer.cell_stride = cell_stride;
    scratch = delta_net_scratch(d, rows, true, take(scratch_floats));
    qkv = take((size_t)rows * C);
    z = take((size_t)rows * VD);
    alpha = take((size_t)rows * nv);
    beta = take((size_t)rows * nv);
    out = take((size_t)rows * VD);
    act.q = reinterpret_cast<int8_t*>(arena.take((size_t)rows * VD));
    act.d = take((size_t)rows * (VD / 32 + 1));
    act.s = take((size_t)rows * (VD / 32 + 1));
    recs = reinterpret_cast<DeltaNetSeqDev*>(arena.take((size_t)max_seqs * sizeof(DeltaNetSeqDev)));
    count = reinterpret_cast<int*>(arena.take(4));
  }
};

void upload(const float* dst, const float* src, size_t n) {
  ROOFLINE_CUDA_CHECK(cudaMemcpy(const_cast<float*>(dst), src, n * 4, cudaMemcpyHostToDevice));
}

DeltaNetForm form_of(GpuDeltaNetForm f) { return f == GpuDeltaNetForm::Recurrent ? DeltaNetForm::Recurrent : DeltaNetForm::Chunked; }

// The three steps as the backend would launch them (the precise chunked variant only from here).
void run_step(const DeltaNetDims& d, DeltaNetRig& rig, float eps, const DeltaNetSeqs& seqs, int rows, GpuDeltaNetForm form,
              int max_seq_rows, bool int8, cudaStream_t stream) {
  const ActQ8 act = int8 ? rig.act : ActQ8{};
  if (form == GpuDeltaNetForm::ChunkedPrecise && delta_net_chunked_supported(d)) {
    delta_net_prepare(d, rig.layer, seqs, rows, rig.qkv, rig.alpha, rig.beta, rig.scratch, stream);
    delta_net_chunked(d, rig.layer, seqs, max_seq_rows, rig.qkv, rig.scratch, true, stream);
    delta_net_output(d, rig.layer, eps, seqs, rows, rig.z, rig.scratch, rig.out, act, stream);
    return;
  }
  delta_net_forward(d, rig.layer, eps, seqs, rows, form_of(form), max_seq_rows, rig.qkv, rig.z, rig.alpha, rig.beta,
                    rig.scratch, rig.out, act, stream);
}

}  // namespace

bool gpu_delta_net_chunked_supported(const DeltaNetDims& dims, int device) {
  ROOFLINE_CUDA_CHECK(cudaSetDevice(device));
  return cuda::delta_net_chunked_supported(dims);
}

std::vector<float> gpu_delta_net_for_test(const DeltaNetDims& d, const float* conv, const float* dt_bias, const float* a,
                                          const float* norm, float eps, const std::vector<GpuDeltaNetSeq>& seqs,
                                          const float* qkv, const float* z, const float* alpha, const float* beta, int n_rows,
                                          GpuDeltaNetForm form, bool graph, std::vector<float>* int8_out, int device) {
  ROOFLINE_CUDA_CHECK(cudaSetDevice(device));
  const int n_seqs = (int)seqs.size(), rows = n_rows + 2, max_seqs = n_seqs + 2, cells = n_seqs + 1;
  const size_t C = d.conv_dim(), VD = d.value_dim(), nv = d.n_v_heads, state_floats = d.state_floats();
  if (int8_out && VD % 32) fail("gpu_delta_net_for_test: int8 output needs value_dim % 32 == 0");
  DeltaNetRig rig(d, rows, cells, max_seqs);
  cudaStream_t stream;
  ROOFLINE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  upload(rig.layer.conv, conv, C * d.conv_kernel);
  upload(rig.layer.dt_bias, dt_bias, nv);
  upload(rig.layer.a, a, nv);
  upload(rig.layer.norm, norm, d.head_v);
  // Inputs, with two padding rows of large values after the real ones.
  auto rows_of = [&](const float* src, size_t width) {
    std::vector<float> v((size_t)rows * width, 1e4f);
    std::copy(src, src + (size_t)n_rows * width, v.begin());
    return v;
  };
  upload(rig.qkv, rows_of(qkv, C).data(), (size_t)rows * C);
  upload(rig.z, rows_of(z, VD).data(), (size_t)rows * VD);
  upload(rig.alpha, rows_of(alpha, nv).data(), (size_t)rows * nv);
  upload(rig.beta, rows_of(beta, nv).data(), (size_t)rows * nv);
  ROOFLINE_CUDA_CHECK(cudaMemset(rig.out, 0x7f, (size_t)rows * VD * 4));  // garbage the kernels must overwrite

  // Cells: sequence i in cell n_seqs - i; cell 0 (the padding records') and fresh ones hold NaNs.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> cells_host((size_t)cells * rig.cell_stride, nan);
  std::vector<DeltaNetSeqDev> recs((size_t)max_seqs);
  int max_seq_rows = 1;
  for (int i = 0; i < n_seqs; ++i) {
    const GpuDeltaNetSeq& s = seqs[(size_t)i];
    DeltaNetSeqDev& r = recs[(size_t)i];
    r.first_row = s.first_row;
    r.n_rows = s.n_rows;
    r.fresh = s.fresh ? 1 : 0;
    r.cell = n_seqs - i;
    max_seq_rows = std::max(max_seq_rows, s.n_rows);
    if (!s.fresh) std::copy(s.state, s.state + state_floats, cells_host.begin() + (int64_t)r.cell * rig.cell_stride);
  }
  // Records beyond the count: plausible but wrong (row 0, the spare cell 0); processing one would
  // corrupt row 0's output or read NaNs.
  for (int i = n_seqs; i < max_seqs; ++i) recs[(size_t)i] = DeltaNetSeqDev{0, std::max(1, n_rows), 0, 0};
  upload(rig.layer.state, cells_host.data(), cells_host.size());
  ROOFLINE_CUDA_CHECK(cudaMemcpy(rig.recs, recs.data(), recs.size() * sizeof(DeltaNetSeqDev), cudaMemcpyHostToDevice));

  DeltaNetSeqs dseqs;
  dseqs.seqs = rig.recs;
  dseqs.count = rig.count;
  dseqs.max_seqs = max_seqs;
  const bool int8 = int8_out != nullptr;
  if (graph) {
    const int zero = 0;
    ROOFLINE_CUDA_CHECK(cudaMemcpy(rig.count, &zero, 4, cudaMemcpyHostToDevice));
    cudaGraphExec_t exec = capture_graph(stream, [&] { run_step(d, rig, eps, dseqs, rows, form, max_seq_rows, int8, stream); });
    ROOFLINE_CUDA_CHECK(cudaMemcpy(rig.count, &n_seqs, 4, cudaMemcpyHostToDevice));
    ROOFLINE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream));
    cudaGraphExecDestroy(exec);
  } else {
    ROOFLINE_CUDA_CHECK(cudaMemcpy(rig.count, &n_seqs, 4, cudaMemcpyHostToDevice));
    run_step(d, rig, eps, dseqs, rows, form, max_seq_rows, int8, stream);
  }
  ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream));
  ROOFLINE_CUDA_CHECK(cudaGetLastError());

  std::vector<float> out((size_t)rows * VD);
  if (int8) {
    std::vector<int8_t> q((size_t)rows * VD);
    std::vector<float> dq((size_t)rows * (VD / 32));
    ROOFLINE_CUDA_CHECK(cudaMemcpy(q.data(), rig.act.q, q.size(), cudaMemcpyDeviceToHost));
    ROOFLINE_CUDA_CHECK(cudaMemcpy(dq.data(), rig.act.d, dq.size() * 4, cudaMemcpyDeviceToHost));
    int8_out->resize(q.size());
    for (size_t i = 0; i < q.size(); ++i) (*int8_out)[i] = (float)q[i] * dq[i / 32];
  }
  ROOFLINE_CUDA_CHECK(cudaMemcpy(out.data(), rig.out, out.size() * 4, cudaMemcpyDeviceToHost));
  ROOFLINE_CUDA_CHECK(cudaMemcpy(cells_host.data(), rig.layer.state, cells_host.size() * 4, cudaMemcpyDeviceToHost));
  for (int i = 0; i < n_seqs; ++i) {
    const float* src = cells_host.data() + (int64_t)(n_seqs - i) * rig.cell_stride;
    std::copy(src, src + state_floats, seqs[(size_t)i].state);
  }
  // The spare cell must be untouched (all NaN) and the padding between cells too.
  for (int64_t i = 0; i < rig.cell_stride; ++i)
    if (!std::isnan(cells_host[(size_t)i])) fail("gpu_delta_net_for_test: the spare cell was written (float {})", i);
  for (int c = 1; c < cells; ++c)
    for (int64_t i = (int64_t)state_floats; i < rig.cell_stride; ++i)
      if (!std::isnan(cells_host[(size_t)(c * rig.cell_stride + i)])) fail("gpu_delta_net_for_test: cell {} written past its state", c);
  ROOFLINE_CUDA_CHECK(cudaStreamDestroy(stream));
  return out;
}

std::vector<double> gpu_delta_net_time_for_test(const DeltaNetDims& d, int n_seqs, int rows_per_seq, GpuDeltaNetForm form,
                                                int reps, int device) {
  ROOFLINE_CUDA_CHECK(cudaSetDevice(device));
  const int rows = n_seqs * rows_per_seq;
  const size_t C = d.conv_dim(), VD = d.value_dim(), nv = d.n_v_heads;
  DeltaNetRig rig(d, rows, n_seqs, n_seqs);
  Rng rng(7);
  auto fill = [&](const float* dst, size_t n, double scale, double offset) {
    std::vector<float> v(n);
    for (float& x : v) x = (float)(offset + scale * rng.normal());
    upload(dst, v.data(), n);
  };
  fill(rig.layer.conv, C * d.conv_kernel, 0.3, 0);
  fill(rig.layer.dt_bias, nv, 0.5, 0);
  fill(rig.layer.a, nv, 0.1, -1.0);
  fill(rig.layer.norm, d.head_v, 0.1, 1.0);
  fill(rig.layer.state, (size_t)n_seqs * rig.cell_stride, 0.05, 0);
  fill(rig.qkv, (size_t)rows * C, 1.0, 0);
  fill(rig.z, (size_t)rows * VD, 1.0, 0);
  fill(rig.alpha, (size_t)rows * nv, 1.0, 0);
  fill(rig.beta, (size_t)rows * nv, 1.0, 0);
  std::vector<DeltaNetSeqDev> recs((size_t)n_seqs);
  for (int i = 0; i < n_seqs; ++i) recs[(size_t)i] = DeltaNetSeqDev{i * rows_per_seq, rows_per_seq, 0, i};
  ROOFLINE_CUDA_CHECK(cudaMemcpy(rig.recs, recs.data(), recs.size() * sizeof(DeltaNetSeqDev), cudaMemcpyHostToDevice));
  ROOFLINE_CUDA_CHECK(cudaMemcpy(rig.count, &n_seqs, 4, cudaMemcpyHostToDevice));
  DeltaNetSeqs seqs;
  seqs.seqs = rig.recs;
  seqs.count = rig.count;
  seqs.max_seqs = n_seqs;
  cudaStream_t stream;
  ROOFLINE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const ActQ8 act = VD % 32 == 0 ? rig.act : ActQ8{};
  const bool chunked = form != GpuDeltaNetForm::Recurrent && delta_net_chunked_supported(d);
  const bool precise = form == GpuDeltaNetForm::ChunkedPrecise;
  const DeltaNetScratch& s = rig.scratch;
  // The states decay towards zero over the repetitions; the timing does not depend on their values.
  auto phase = [&](int which) {
    if (which & 1) delta_net_prepare(d, rig.layer, seqs, rows, rig.qkv, rig.alpha, rig.beta, s, stream);
    if (which & 2) {
      if (chunked) delta_net_chunked(d, rig.layer, seqs, rows_per_seq, rig.qkv, s, precise, stream, 1);
      else delta_net_recurrent(d, rig.layer, seqs, rows_per_seq, rig.qkv, s, stream);
    }
    if ((which & 4) && chunked) delta_net_chunked(d, rig.layer, seqs, rows_per_seq, rig.qkv, s, precise, stream, 2);
    if (which & 8) delta_net_output(d, rig.layer, 1e-6f, seqs, rows, rig.z, s, rig.out, act, stream);
  };
  phase(15);  // fills every buffer (and sets the chunked kernels' shared-memory limits outside a capture)
  auto time_graph = [&](int which) { return time_in_graph_us(stream, reps, [&] { phase(which); }); };
  std::vector<double> t(5, 0.0);
  if (reps > 0) t = {time_graph(15), time_graph(1), time_graph(2), chunked ? time_graph(4) : 0.0, time_graph(8)};
  ROOFLINE_CUDA_CHECK(cudaStreamSynchronize(stream));
  ROOFLINE_CUDA_CHECK(cudaStreamDestroy(stream));
  return t;
}

}  // namespace roofline
