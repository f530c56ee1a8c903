// The CUDA kernels of the Gated DeltaNet mixer against delta_net_reference (skipped without a GPU):
// odd shapes (k heads 1-3, v/k ratio 1-3, head dims 16-256 and non-powers of two, conv kernels 2-4),
// runs of 1 to 520 tokens, several sequences per call, fresh and carried states, the recurrent and the
// chunked forms, graph-captured decode buckets, and the int8 output. Errors are NMSE in double.
// Run on the GPU machine: roofline_tests --gtest_filter='GpuDeltaNet*'.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/delta_net.h"
#include "backend/gpu.h"
#include "core/rng.h"
#include "test_util.h"

using namespace roofline;

namespace {

bool have_gpu() { return !gpu_devices().empty(); }
#define SKIP_WITHOUT_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU in this build or machine"

DeltaNetDims dims(int n_k, int ratio, int dk, int dv, int K) {
  DeltaNetDims d;
  d.n_k_heads = n_k;
  d.n_v_heads = n_k * ratio;
  d.head_k = dk;
  d.head_v = dv;
  d.conv_kernel = K;
  return d;
}

const char* form_name(GpuDeltaNetForm f) {
  return f == GpuDeltaNetForm::Recurrent ? "recurrent" : f == GpuDeltaNetForm::Chunked ? "chunked" : "chunked-precise";
}

// Random weights and inputs at the scales of a trained model (decays from ~0.9 to ~0.1 per token).
struct Problem {
  DeltaNetDims d;
  std::vector<float> conv, dt_bias, a, norm, qkv, z, alpha, beta;
  std::vector<int> runs;
  std::vector<bool> fresh;
  std::vector<std::vector<float>> states;  // per sequence (carried ones random)
  int n_rows = 0;

  Problem(const DeltaNetDims& dims, std::vector<int> run_lengths, std::vector<bool> fresh_flags, uint64_t seed)
      : d(dims), runs(std::move(run_lengths)), fresh(std::move(fresh_flags)) {
    Rng rng(seed);
    auto normal = [&](std::vector<float>& v, size_t n, double scale, double offset) {
      v.resize(n);
      for (float& x : v) x = (float)(offset + scale * rng.normal());
    };
    for (int r : runs) n_rows += r;
    const size_t C = d.conv_dim(), VD = d.value_dim(), nv = d.n_v_heads;
    normal(conv, C * d.conv_kernel, 0.4, 0.0);
    normal(dt_bias, nv, 0.5, 0.0);
    a.resize(nv);
    for (float& x : a) x = -(float)std::exp(-2.0 + 3.0 * rng.uniform());
    normal(norm, d.head_v, 0.1, 1.0);
    normal(qkv, (size_t)n_rows * C, 1.0, 0.0);
    normal(z, (size_t)n_rows * VD, 1.0, 0.0);
    normal(alpha, (size_t)n_rows * nv, 1.0, 0.0);
    normal(beta, (size_t)n_rows * nv, 1.5, 0.0);
    for (size_t i = 0; i < runs.size(); ++i) {
      std::vector<float> s;
      normal(s, d.state_floats(), 0.5, 0.0);
      states.push_back(std::move(s));
    }
  }
  DeltaNetWeights weights() const { return {conv.data(), dt_bias.data(), a.data(), norm.data()}; }
  std::vector<float> run_gpu(std::vector<std::vector<float>>& st, float eps, GpuDeltaNetForm form, bool graph,
                             std::vector<float>* int8_out) const {
    std::vector<GpuDeltaNetSeq> gs;
    for (const DeltaNetSeq& s : seqs(st)) gs.push_back({s.first_row, s.n_rows, s.fresh, s.state});
    return gpu_delta_net_for_test(d, conv.data(), dt_bias.data(), a.data(), norm.data(), eps, gs, qkv.data(), z.data(),
                                  alpha.data(), beta.data(), n_rows, form, graph, int8_out);
  }
  std::vector<DeltaNetSeq> seqs(std::vector<std::vector<float>>& st) const {
    std::vector<DeltaNetSeq> out;
    int row = 0;
    for (size_t i = 0; i < runs.size(); ++i) {
      out.push_back({row, runs[i], (bool)fresh[i], st[i].data()});
      row += runs[i];
    }
    return out;
  }
};

struct Errors {
  double out = 0, window = 0, state = 0, int8 = 0, pad = 0;
};

// One call of the mixer on the GPU and in the reference from the same states; every error measured.
Errors compare(const Problem& p, GpuDeltaNetForm form, bool graph, bool int8, float eps = 1e-6f) {
  std::vector<std::vector<float>> ref_states = p.states, gpu_states = p.states;
  const size_t VD = p.d.value_dim();
  std::vector<float> ref((size_t)p.n_rows * VD);
  const auto ref_seqs = p.seqs(ref_states);
  delta_net_reference(p.d, p.weights(), eps, ref_seqs, p.qkv.data(), p.z.data(), p.alpha.data(), p.beta.data(), ref.data());
  std::vector<float> q8;
  const auto out = p.run_gpu(gpu_states, eps, form, graph, int8 ? &q8 : nullptr);
  Errors e;
  e.out = test::nmse(out.data(), ref.data(), ref.size());
  for (size_t i = ref.size(); i < out.size(); ++i) e.pad = std::max(e.pad, (double)std::fabs(out[i]));
  if (int8) {
    e.int8 = test::nmse(q8.data(), ref.data(), ref.size());
    for (size_t i = ref.size(); i < q8.size(); ++i) e.pad = std::max(e.pad, (double)std::fabs(q8[i]));
  }
  const size_t wf = p.d.conv_state_floats();
  for (size_t s = 0; s < p.runs.size(); ++s) {
    if (wf) e.window = std::max(e.window, test::nmse(gpu_states[s].data(), ref_states[s].data(), wf));
    e.state = std::max(e.state, test::nmse(gpu_states[s].data() + wf, ref_states[s].data() + wf, p.d.ssm_state_floats()));
  }
  return e;
}

// Bounds per form: fp32 throughout for recurrent; tf32 products (10-bit mantissas) for chunked, whose
// error the compensated variant takes back to fp32 levels.
double out_bound(GpuDeltaNetForm f) { return f == GpuDeltaNetForm::Chunked ? 2e-5 : 1e-8; }

void expect_close(const Problem& p, GpuDeltaNetForm form, bool graph, bool int8, const char* what) {
  const Errors e = compare(p, form, graph, int8);
  std::printf("  %-16s %-28s out %.2e state %.2e window %.2e int8 %.2e\n", form_name(form), what, e.out, e.state, e.window,
              e.int8);
  EXPECT_LT(e.out, out_bound(form)) << what;
  EXPECT_LT(e.state, out_bound(form)) << what;
  EXPECT_LT(e.window, 1e-14) << what;  // the window is copied, never computed
  EXPECT_EQ(e.pad, 0.0) << what << ": padding rows must come back zero";
  if (int8) {
    EXPECT_LT(e.int8, 3e-4) << what;  // int8 blocks of 32: ~1e-4 measured, the quantization's own error
  }
}

std::vector<GpuDeltaNetForm> forms(const DeltaNetDims& d) {
  std::vector<GpuDeltaNetForm> f = {GpuDeltaNetForm::Recurrent};
  if (gpu_delta_net_chunked_supported(d)) {
    f.push_back(GpuDeltaNetForm::Chunked);
    f.push_back(GpuDeltaNetForm::ChunkedPrecise);
  }
  return f;
}

}  // namespace

// Decode batches: one row per sequence, fresh and carried, through a captured graph, over several steps
// with each side carrying its own states (errors must not grow).
TEST(GpuDeltaNet, DecodeStepsInGraph) {
  SKIP_WITHOUT_GPU();
  for (const DeltaNetDims& d : {dims(2, 3, 128, 128, 4), dims(1, 2, 32, 48, 2), dims(3, 1, 16, 16, 4)}) {
    Problem p(d, {1, 1, 1, 1, 1, 1, 1}, {false, true, false, false, true, false, false}, 11);
    std::vector<std::vector<float>> ref_states = p.states, gpu_states = p.states;
    double worst = 0;
    for (int step = 0; step < 6; ++step) {
      // New inputs each step, the same weights.
      Problem q(d, p.runs, step == 0 ? p.fresh : std::vector<bool>(p.runs.size(), false), 100 + step);
      q.conv = p.conv, q.dt_bias = p.dt_bias, q.a = p.a, q.norm = p.norm;
      const size_t VD = d.value_dim();
      std::vector<float> ref((size_t)q.n_rows * VD);
      const auto rs = q.seqs(ref_states);
      delta_net_reference(d, q.weights(), 1e-6f, rs, q.qkv.data(), q.z.data(), q.alpha.data(), q.beta.data(), ref.data());
      const auto out = q.run_gpu(gpu_states, 1e-6f, GpuDeltaNetForm::Recurrent, true, nullptr);
      const double e = test::nmse(out.data(), ref.data(), ref.size());
      worst = std::max(worst, e);
      for (size_t i = ref.size(); i < out.size(); ++i) ASSERT_EQ(out[i], 0.0f);
    }
    std::printf("  decode dk %d dv %d: worst out nmse over 6 steps %.2e\n", d.head_k, d.head_v, worst);
    EXPECT_LT(worst, 1e-8);
  }
}

// Every form over odd shapes and run lengths, several sequences per call.
TEST(GpuDeltaNet, ShapesAndRuns) {
  SKIP_WITHOUT_GPU();
  struct Shape {
    DeltaNetDims d;
    const char* name;
  };
  const std::vector<Shape> shapes = {
      {dims(1, 1, 16, 16, 4), "nk1 r1 dk16 dv16 K4"},  {dims(2, 3, 32, 32, 4), "nk2 r3 dk32 dv32 K4"},
      {dims(3, 2, 64, 64, 2), "nk3 r2 dk64 dv64 K2"},  {dims(1, 3, 128, 128, 4), "nk1 r3 dk128 dv128 K4"},
      {dims(2, 1, 48, 40, 4), "nk2 r1 dk48 dv40 K4"},  {dims(1, 2, 36, 20, 3), "nk1 r2 dk36 dv20 K3"},
      {dims(1, 1, 256, 64, 4), "nk1 r1 dk256 dv64 K4"}, {dims(2, 2, 96, 128, 1), "nk2 r2 dk96 dv128 K1"},
  };
  for (const Shape& s : shapes) {
    std::printf("%s\n", s.name);
    // Runs of every chunk boundary case, fresh and carried, in one call.
    const Problem many(s.d, {1, 2, 63, 64, 65, 200}, {true, false, false, true, false, true}, 21);
    const Problem long_run(s.d, {520}, {false}, 22);
    for (GpuDeltaNetForm f : forms(s.d)) {
      expect_close(many, f, false, false, "runs 1,2,63,64,65,200");
      expect_close(long_run, f, false, false, "run 520 carried");
    }
  }
}

// More than 32 sequences in one call (the kernels look a row's record up 32 records at a time).
TEST(GpuDeltaNet, ManySequences) {
  SKIP_WITHOUT_GPU();
  const DeltaNetDims d = dims(2, 2, 64, 64, 4);
  std::vector<int> runs(40, 1);
  runs[7] = 3, runs[33] = 70, runs[39] = 2;
  std::vector<bool> fresh(runs.size(), false);
  for (size_t i = 0; i < fresh.size(); i += 3) fresh[i] = true;
  const Problem p(d, runs, fresh, 51);
  for (GpuDeltaNetForm f : forms(d)) expect_close(p, f, false, true, "40 sequences");
  expect_close(p, GpuDeltaNetForm::Recurrent, true, true, "40 sequences in a graph");
}

// The int8 activations for ssm_out, with heads of whole 32-blocks and with blocks across heads.
TEST(GpuDeltaNet, Int8Output) {
  SKIP_WITHOUT_GPU();
  for (const DeltaNetDims& d : {dims(2, 3, 128, 128, 4), dims(2, 2, 32, 48, 4), dims(1, 4, 16, 24, 2)}) {
    const Problem p(d, {3, 1, 70}, {true, false, false}, 31);
    for (GpuDeltaNetForm f : forms(d)) expect_close(p, f, false, true, "int8");
    expect_close(p, GpuDeltaNetForm::Recurrent, true, true, "int8 in a graph");
  }
}

// Qwen3.5-27B's mixer: how long one layer takes (printed; the expectations are in
// cuda_delta_net.cu's header comment), and that 27B shapes match the reference.
TEST(GpuDeltaNet, Qwen35_27B) {
  SKIP_WITHOUT_GPU();
  const DeltaNetDims d = dims(16, 3, 128, 128, 4);
  const Problem p(d, {1, 1, 130}, {false, true, false}, 41);
  for (GpuDeltaNetForm f : forms(d)) expect_close(p, f, false, true, "27B shape");
  const double state_mb = d.ssm_state_floats() * 4.0 / 1e6;
  auto show = [&](const char* what, const std::vector<double>& t, double mb) {
    std::printf("  27B %-34s %7.1f us per layer (prepare %.1f, rule %.1f + %.1f, output %.1f)", what, t[0], t[1], t[2], t[3],
                t[4]);
    if (mb > 0) std::printf(", rule at %.0f GB/s", mb * 1e3 / t[2]);
    std::printf("\n");
  };
  for (int n : {1, 8, 64}) {
    const std::string what = "decode, " + std::to_string(n) + " sequences:";
    show(what.c_str(), gpu_delta_net_time_for_test(d, n, 1, GpuDeltaNetForm::Recurrent, 20), 2 * n * state_mb);
  }
  for (GpuDeltaNetForm f : forms(d)) {
    const std::string what = std::string("prefill 512, ") + form_name(f) + ":";
    show(what.c_str(), gpu_delta_net_time_for_test(d, 1, 512, f, 5), 0);
  }
  const GpuDeltaNetForm prefill = gpu_delta_net_chunked_supported(d) ? GpuDeltaNetForm::Chunked : GpuDeltaNetForm::Recurrent;
  show((std::string("prefill 4 x 512, ") + form_name(prefill) + ":").c_str(), gpu_delta_net_time_for_test(d, 4, 512, prefill, 3), 0);
}

// One launch of each kernel on the 27B shape (decode 64, prefill 512 both forms), for a profiler:
// roofline_tests --gtest_also_run_disabled_tests --gtest_filter='GpuDeltaNet.DISABLED_ProfileTarget'.
TEST(GpuDeltaNet, DISABLED_ProfileTarget) {
  SKIP_WITHOUT_GPU();
  const DeltaNetDims d = dims(16, 3, 128, 128, 4);
  gpu_delta_net_time_for_test(d, 64, 1, GpuDeltaNetForm::Recurrent, 0);
  gpu_delta_net_time_for_test(d, 1, 512, GpuDeltaNetForm::Recurrent, 0);
  gpu_delta_net_time_for_test(d, 1, 512, GpuDeltaNetForm::Chunked, 0);
}
