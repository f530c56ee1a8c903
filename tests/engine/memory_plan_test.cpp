// The planner (`roofline plan`): bills against the model's real tensor bytes, the fit flipping at the
// right memory size, -ngl auto's choice against an independent search, the GPU table, config.json
// shapes against the built-in ones, and (on a GPU) the planned byte accounting and placement against
// the CUDA backend's and Engine::create's.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "backend/gpu.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/gpu_table.h"
#include "engine/memory_plan.h"
#include "engine/placement.h"
#include "engine/roofline_model.h"
#include "model/hf_config_shape.h"
#include "model/model_file.h"
#include "model/synthetic.h"

using namespace roofline;

namespace {

constexpr double kGiB = 1073741824.0;

std::shared_ptr<const Model> layout(const std::string& spec) {
  ModelFileOptions o;
  o.layout_only = true;
  return Model::load(open_model_file(spec, o));
}

GpuSpec card(const char* name, double gib = 0) {
  GpuSpec g = *find_gpu_spec(name);
  if (gib > 0) g.memory_gib = gib;
  return g;
}

// Bytes the GPU needs for the last k units, summed unit by unit (the planner sums ranges).
double gpu_need_by_units(const Model& m, int k, const PlanSettings& s, int n_cells) {
  const int n_layer = m.hparams().n_layer, n_units = n_layer + 1;
  KvConfig kv;
  kv.block_size = s.kv_block_size;
  kv.n_blocks = (s.n_ctx + kv.block_size - 1) / kv.block_size;
  kv.type_k = s.type_k;
  kv.type_v = s.type_v;
  double need = 0;
  for (int u = n_units - k; u < n_units; ++u) {
    const LayerSet one{u, std::min(u + 1, n_layer), u == 0, u + 1 == n_units};
    need += (double)planned_gpu_weight_bytes(m, one) + (double)planned_gpu_kv_block_bytes(m, one, kv) * kv.n_blocks +
            (double)planned_gpu_state_cell_bytes(m, one) * n_cells;
  }
  // rope_freqs is counted once per range, not per unit
  need -= (k - 1) * (double)((m.rope_freqs() ? m.rope_freqs().tensor->n_elements() * 4 + 255 : 0) / 256 * 256);
  return need;
}

}  // namespace

TEST(MemoryPlan, HostBillIsTheFilesTensorBytesAndTheKvCache) {
  for (const char* spec : {"synthetic:qwen3-8b:Q4_K_M", "synthetic:qwen3-32b:Q8_0", "synthetic:qwen3.5-27b:Q4_K_M"}) {
    auto m = layout(spec);
    PlanSettings s;
    s.n_ctx = 4000;
    s.n_parallel = 2;
    const Plan p = make_plan(*m, card("cpu", 4096), s);
    EXPECT_EQ(p.n_gpu_layers, 0);
    EXPECT_DOUBLE_EQ(p.host_bill.weights, (double)m->file().total_tensor_bytes()) << spec;
    // 4000 positions round up to 125 blocks of 32.
    EXPECT_DOUBLE_EQ(p.kv_bytes_total, kv_bytes_per_position(*m, DType::F16, DType::F16) * 4000) << spec;
    EXPECT_DOUBLE_EQ(p.kv_bytes_per_slot, p.kv_bytes_total / 2);
    EXPECT_DOUBLE_EQ(p.host_bytes_per_token, decode_bytes_per_token(*m, 0, DType::F16, DType::F16));
    EXPECT_TRUE(p.fits);
  }
}

TEST(MemoryPlan, GpuBillIsTheTensorBytesUpToAlignment) {
  for (const char* spec : {"synthetic:qwen3-8b:Q4_K_M", "synthetic:qwen3-8b:Q8_0", "synthetic:qwen3.5-27b:Q4_K_M", "synthetic:qwen3-0.6b:Q6_K"}) {
    auto m = layout(spec);
    PlanSettings s;
    s.n_ctx = 4096;
    s.type_k = s.type_v = DType::Q8_0;
    const Plan p = make_plan(*m, card("h200"), s);
    ASSERT_EQ(p.n_gpu_layers, p.n_units) << spec;
    const double file = (double)m->file().total_tensor_bytes();
    EXPECT_GE(p.gpu_bill.weights, file) << spec;
    EXPECT_LE(p.gpu_bill.weights, file + 2.0 * 4 * 256 * m->file().tensors().size()) << spec;  // planes aligned to 256
    EXPECT_DOUBLE_EQ(p.host_bill.total(), 0);
    // q8_0 KV: 34 bytes per 32 values, plus 1 KiB of per-block records per attention layer.
    const int n_attn = m->hparams().count_layers(MixerKind::Attention);
    EXPECT_DOUBLE_EQ(p.gpu_bill.kv, kv_bytes_per_position(*m, DType::Q8_0, DType::Q8_0) * 4096 + 128.0 * n_attn * 1024) << spec;
    EXPECT_NEAR(p.gpu_bytes_per_token, decode_bytes_per_token(*m, 0, DType::Q8_0, DType::Q8_0), 1) << spec;
  }
}

TEST(MemoryPlan, PartialOffloadSplitsTheWeightsWithoutLosingAny) {
  auto m = layout("synthetic:qwen3-8b:Q4_K_M");
  PlanSettings s;
  s.n_ctx = 8192;
  for (int ngl : {0, 1, 10, 36, 37}) {
    s.n_gpu_layers = ngl;
    const Plan p = make_plan(*m, card("h200"), s);
    EXPECT_EQ(p.n_gpu_layers, ngl);
    // The host holds units [0, 37 - ngl): the embedding and the first layers.
    double gpu_raw = 0;
    for (int il = 37 - ngl; il < 36; ++il) gpu_raw += (double)m->layer_bytes(il);
    if (ngl > 0) gpu_raw += (double)m->output_bytes();
    if (ngl == 37) gpu_raw += (double)m->token_embd().bytes();
    EXPECT_DOUBLE_EQ(p.host_bill.weights + gpu_raw, (double)m->file().total_tensor_bytes()) << ngl;
    EXPECT_NEAR(p.gpu_bytes_per_token + p.host_bytes_per_token, decode_bytes_per_token(*m, 0, DType::F16, DType::F16), 1);
    EXPECT_NEAR(p.kv_bytes_total, kv_bytes_per_position(*m, DType::F16, DType::F16) * 8192 + (ngl == 0 ? 0 : ngl - 1) * 256.0 * 1024, 1);
  }
}

TEST(MemoryPlan, FitFlipsAtTheMemoryTheBillAddsUpTo) {
  for (const char* spec : {"synthetic:qwen3-8b:Q8_0", "synthetic:qwen3.5-27b:Q4_K_M"}) {
    auto m = layout(spec);
    PlanSettings s;
    s.n_ctx = 16384;
    s.n_parallel = 4;
    // A card under 64 GiB, as every card of the flip below is: its bill has the GEMM scratch they get.
    const Plan big = make_plan(*m, card("h200", 48.0), s);
    ASSERT_TRUE(big.fits);
    const double need_gib = big.gpu_bill.total() / kGiB;
    const Plan just = make_plan(*m, card("h200", need_gib + 0.001), s);
    EXPECT_TRUE(just.fits) << spec;
    EXPECT_EQ(just.n_gpu_layers, just.n_units);
    const Plan under = make_plan(*m, card("h200", need_gib - 0.001), s);
    EXPECT_FALSE(under.fits) << spec;
    EXPECT_LT(under.n_gpu_layers, under.n_units);
    EXPECT_GT(under.n_gpu_layers, 0);
    // --vram-limit as serve takes it: the limit replaces free memory (the context is not in it).
    PlanSettings limited = s;
    limited.vram_limit_gib = need_gib - 0.5 + 0.001;
    EXPECT_TRUE(make_plan(*m, card("h200"), limited).fits) << spec;
    limited.vram_limit_gib = need_gib - 0.5 - 0.001;
    EXPECT_FALSE(make_plan(*m, card("h200"), limited).fits) << spec;
  }
}

// The prompt GEMMs' weight scratch grows to whole matrices on GPUs of 64 GiB and more, and the bill's work
// line (what -ngl auto keeps free) says so; a --vram-limit under that keeps the small scratch.
TEST(MemoryPlan, LargeGpusBillTheWholeMatrixGemmScratch) {
  EXPECT_EQ(gemm_scratch_bytes(24 * kGiB), 128u << 20);
  EXPECT_EQ(gemm_scratch_bytes(63.9 * kGiB), 128u << 20);
  EXPECT_EQ(gemm_scratch_bytes(64 * kGiB), 320u << 20);
  auto m = layout("synthetic:qwen3-8b:Q4_K_M");
  PlanSettings s;
  const Plan small = make_plan(*m, card("h200", 48.0), s);
  const Plan big = make_plan(*m, card("h200"), s);
  EXPECT_EQ(dequant_ahead_slots(63.9 * kGiB), 0);
  EXPECT_EQ(dequant_ahead_slots(64 * kGiB), 2);
  EXPECT_DOUBLE_EQ(big.gpu_bill.work - small.gpu_bill.work, (192.0 + 2 * 320.0) * 1048576);
  s.vram_limit_gib = 40;
  EXPECT_DOUBLE_EQ(make_plan(*m, card("h200"), s).gpu_bill.work, small.gpu_bill.work);
}

// The f16 copies a GPU's layers would keep for prompts (--f16-copies): two bytes per weight of every layer
// matrix but the stacked experts, counted independently here from the tensor table; all of them fit on an
// H200 beside qwen3-8b, part of them in what a 16 GiB card leaves (and that share is what the bill leaves
// divided by their bytes), none with them off or capped at nothing; the prefill prediction moves with the share.
TEST(MemoryPlan, F16CopiesTakeWhatTheBillLeaves) {
  auto m = layout("synthetic:qwen3-8b:Q4_K_M");
  const HParams& hp = m->hparams();
  double want = 0;
  for (int il = 0; il < hp.n_layer; ++il)
    for (LayerTensor t : {LayerTensor::AttnQ, LayerTensor::AttnK, LayerTensor::AttnV, LayerTensor::AttnOut, LayerTensor::FfnGate,
                          LayerTensor::FfnUp, LayerTensor::FfnDown})
      want += 2.0 * (double)m->layer(il)[t].tensor->n_elements();
  PlanSettings s;
  const Plan h200 = make_plan(*m, card("h200"), s);
  EXPECT_DOUBLE_EQ(h200.f16_copy_bytes, want);
  EXPECT_DOUBLE_EQ(h200.f16_copy_share, 1.0);
  const Plan small = make_plan(*m, card("h200", 16.0), s);
  ASSERT_TRUE(small.fits);
  EXPECT_NEAR(small.f16_copy_share, (small.gpu_bill.capacity - small.gpu_bill.total()) / want, 1e-12);
  EXPECT_GT(small.f16_copy_share, 0.0);
  EXPECT_LT(small.f16_copy_share, 1.0);
  s.f16_copies = false;
  const Plan off = make_plan(*m, card("h200"), s);
  EXPECT_EQ(off.f16_copy_share, 0.0);
  EXPECT_NEAR(h200.prefill_tok_s / off.prefill_tok_s, s.prefill_copies_efficiency / s.prefill_efficiency, 1e-9);
  EXPECT_GT(small.prefill_tok_s, off.prefill_tok_s);  // the same card's compute with part of the copies
  EXPECT_LT(small.prefill_tok_s, h200.prefill_tok_s);
  s.f16_copies = true;
  s.f16_copies_max_gib = 1.0;
  EXPECT_NEAR(make_plan(*m, card("h200"), s).f16_copy_share, kGiB / want, 1e-12);
}

TEST(MemoryPlan, ServeTakesLargeStepsOnlyWhereTheWholeModelFitsWithThem) {
  auto m = layout("synthetic:qwen3-32b:Q4_K_M");
  PlanSettings s;  // as load.py's server: 64 slots sharing 32k positions
  s.n_ctx = 32768;
  s.n_parallel = 64;
  EXPECT_EQ(serve_batch_size(*m, card("h200"), s), kLargeServeBatch);
  EXPECT_EQ(serve_batch_size(*m, card("cpu"), s), 512);
  // gemma3-27b's 64 sliding-window rings grow by the step's rows: on an H200 that would cost f16 copies.
  auto gemma = layout("synthetic:gemma3-27b:Q4_K_M");
  EXPECT_EQ(serve_batch_size(*gemma, card("h200"), s), 512);
  PlanSettings no_copies = s;
  no_copies.f16_copies = false;
  EXPECT_EQ(serve_batch_size(*gemma, card("h200"), no_copies), kLargeServeBatch);
  // Cards below 64 GiB (one GEMM scratch size), without copies (with them, a 32B model's 58 GiB of copies want
  // every byte such a card has left): 2048 exactly where the plan with 2048-row steps fits, and some sizes
  // where 512-row steps fit and 2048-row ones do not keep 512.
  s.f16_copies = false;
  int large = 0, kept = 0;
  for (double gib = 20; gib < 40; gib += 0.25) {
    PlanSettings b = s;
    b.n_batch = kLargeServeBatch;
    const Plan plan_large = make_plan(*m, card("rtx4090", gib), b);
    const bool fits_large = plan_large.fits && plan_large.f16_copy_share >= make_plan(*m, card("rtx4090", gib), s).f16_copy_share;
    const bool fits_default = make_plan(*m, card("rtx4090", gib), s).fits;
    const int got = serve_batch_size(*m, card("rtx4090", gib), s);
    EXPECT_EQ(got, fits_large ? kLargeServeBatch : 512) << gib << " GiB";
    large += got == kLargeServeBatch;
    kept += fits_default && !fits_large;
  }
  EXPECT_GT(large, 0);
  EXPECT_GT(kept, 0);
  s.n_batch = 4096;  // a larger default stays
  EXPECT_EQ(serve_batch_size(*m, card("h200"), s), 4096);
}

TEST(MemoryPlan, AutoOffloadIsTheLargestTailThatFitsTheBudget) {
  auto m = layout("synthetic:qwen3.5-27b:Q4_K_M");
  PlanSettings s;
  s.n_ctx = 32768;
  s.n_parallel = 4;
  const int n_cells = 3 * s.n_parallel;
  const HParams& hp = m->hparams();
  for (double gib : {8.0, 12.0, 16.0, 20.0, 24.0}) {
    const Plan p = make_plan(*m, card("rtx4090", gib), s);
    const double budget = gpu_budget_bytes(gib * kGiB - s.cuda_context_gib * kGiB, s.margin_gib, gpu_work_bytes(s.n_batch, hp.n_vocab, hp.n_ff, gib * kGiB));
    int expected = 0;
    for (int k = hp.n_layer + 1; k > 0; --k)
      if (gpu_need_by_units(*m, k, s, n_cells) <= budget) {
        expected = k;
        break;
      }
    EXPECT_EQ(p.n_gpu_layers, expected) << gib;
    EXPECT_EQ(p.state_cells, n_cells);
  }
}

TEST(MemoryPlan, V100RunsA27bQ4KmWithQ8KvAtFourSlots) {
  auto m = layout("synthetic:qwen3.5-27b:Q4_K_M");
  PlanSettings s;
  s.n_ctx = 8192;
  s.n_parallel = 4;
  s.type_k = s.type_v = DType::Q8_0;
  const Plan p = make_plan(*m, card("v100-32gb"), s);
  EXPECT_TRUE(p.fits);
  EXPECT_EQ(p.n_gpu_layers, 65);
  // ~15.6 GB read per token at 900 x 0.88 GB/s: a roofline near 50 tok/s.
  EXPECT_NEAR(p.decode_roofline_tok_s, 900e9 * 0.88 / p.gpu_bytes_per_token, 1e-6);
  EXPECT_GT(p.decode_roofline_tok_s, 40);
  EXPECT_LT(p.decode_roofline_tok_s, 60);
  // The decode model: the bytes at gpu_stream_efficiency of the bandwidth plus gpu_layer_us for each of the 64 layers
  // and gpu_recurrent_layer_us for each of the 48 DeltaNet layers among them.
  EXPECT_NEAR(1.0 / p.decode_tok_s,
              p.gpu_bytes_per_token / (900e9 * 0.88 * s.gpu_stream_efficiency) + (64 * s.gpu_layer_us + 48 * s.gpu_recurrent_layer_us) * 1e-6, 1e-9);
  EXPECT_LT(p.decode_tok_s, p.decode_roofline_tok_s);
  // The mission's 60-64 tok/s with --parallel 4 is the four slots together: a step reads the weights once.
  EXPECT_GT(p.decode_tok_s_all_slots, 2.0 * p.decode_tok_s);
  EXPECT_LT(p.decode_tok_s_all_slots, 4.0 * p.decode_tok_s);
  EXPECT_GT(p.prefill_tok_s, 0);
  EXPECT_FALSE(p.derivation.empty());
}

// The decode model's per-kind terms: a hybrid MoE model with a shared expert (qwen3.5-35b-a3b: 40 layers, 30 of them
// DeltaNet, every one with 8 of 256 experts and a shared expert) adds each kind's time for each of its layers; a dense
// attention model (qwen3-8b) none of them.
TEST(MemoryPlan, DecodeModelAddsTheLaunchesOfEachLayerKind) {
  PlanSettings s;
  s.n_ctx = 4096;
  s.n_parallel = 1;
  const GpuSpec h200 = card("h200");
  const Plan moe = make_plan(*layout("synthetic:qwen3.5-35b-a3b:Q4_K_M"), h200, s);
  ASSERT_TRUE(moe.fits);
  EXPECT_NEAR(1.0 / moe.decode_tok_s,
              moe.gpu_bytes_per_token / (h200.achievable_gbs() * 1e9 * s.gpu_stream_efficiency) +
                  (40 * s.gpu_layer_us + 30 * s.gpu_recurrent_layer_us + 40 * s.gpu_moe_layer_us + 40 * s.gpu_shared_expert_us) * 1e-6,
              1e-9);
  const Plan dense = make_plan(*layout("synthetic:qwen3-8b:Q4_K_M"), h200, s);
  ASSERT_TRUE(dense.fits);
  EXPECT_NEAR(1.0 / dense.decode_tok_s, dense.gpu_bytes_per_token / (h200.achievable_gbs() * 1e9 * s.gpu_stream_efficiency) + 36 * s.gpu_layer_us * 1e-6,
              1e-9);
}

// Every slot generating with more than 8 slots: the tensor-core steps' terms (the weights once, then each row: its KV at
// half a slot's depth), by
// the card's kernels. The qwen3-32b figures are the fit's own (H100, `-npl 16` / `-npl 64` at short depth: 1127 /
// 3208 tok/s); gemma3-27b (1173 / 3289) and qwen3.5-27b (1080 / 2463, with its recurrent state per row) were held out;
// qwen3-30b-a3b (1263 / 2612) takes the routed experts that n rows touch. A card without the tensor-core kernels
// (a V100) and steps of up to 8 rows keep the warp kernels' term.
TEST(MemoryPlan, StepsOfMoreThanEightRowsTakeTheTensorCoreTerms) {
  const GpuSpec h100 = card("h100");
  auto all_slots = [&](const char* shape, int np, const GpuSpec& gpu) {
    PlanSettings s;
    s.n_parallel = np;
    s.n_ctx = 32 * np;
    const Plan p = make_plan(*layout(shape), gpu, s);
    EXPECT_TRUE(p.fits) << shape;
    return p;
  };
  const struct {
    const char* shape;
    double x16, x64, tolerance;
  } measured[] = {{"synthetic:qwen3-32b:Q4_K_M", 1127, 3208, 0.05},
                  {"synthetic:gemma3-27b:Q4_K_M", 1173, 3289, 0.12},
                  {"synthetic:qwen3.5-27b:Q4_K_M", 1080, 2463, 0.10},
                  {"synthetic:qwen3-30b-a3b:Q4_K_M", 1263, 2612, 0.20}};
  for (const auto& m : measured) {
    EXPECT_NEAR(all_slots(m.shape, 16, h100).decode_tok_s_all_slots, m.x16, m.tolerance * m.x16) << m.shape;
    EXPECT_NEAR(all_slots(m.shape, 64, h100).decode_tok_s_all_slots, m.x64, m.tolerance * m.x64) << m.shape;
  }
  // On an H200 the warpgroup kernel dequantizes no faster than on an H100: the weights' rate is capped by the
  // CUDA-core term, and qwen3-32b comes out near what the H200 measured (-p 128 -n 128 -npl 16,64: 1122 / 3087),
  // not 1.4x the H100's (the bandwidth ratio, which the uncapped terms predicted: 1404 / 3641).
  const GpuSpec h200 = card("h200");
  const Plan x16 = all_slots("synthetic:qwen3-32b:Q4_K_M", 16, h200), x64 = all_slots("synthetic:qwen3-32b:Q4_K_M", 64, h200);
  EXPECT_NEAR(x16.decode_tok_s_all_slots, 1122, 0.06 * 1122);
  EXPECT_NEAR(x64.decode_tok_s_all_slots, 3087, 0.06 * 3087);
  EXPECT_TRUE(std::any_of(x64.derivation.begin(), x64.derivation.end(),
                          [](const std::string& l) { return l.find("capped at") != std::string::npos; }));
  // The terms spelled out for a dense model at 64 slots (no state, no experts).
  PlanSettings s;
  const Plan p = all_slots("synthetic:qwen3-32b:Q4_K_M", 64, h100);
  const auto& bt = s.batched_hopper;
  const double kv_row = 1.0 / p.decode_tok_s_full_context - 1.0 / p.decode_tok_s;  // at a full slot's depth
  const double weights_s = p.gpu_bytes_per_token / (h100.achievable_gbs() * 1e9 * bt.stream_efficiency) + 64 * bt.layer_us * 1e-6;
  const double row_s = p.flops_per_token / (h100.tflops * 1e12 * bt.tensor_efficiency) + 64 * bt.row_layer_us * 1e-6;
  EXPECT_NEAR(64.0 / p.decode_tok_s_all_slots, weights_s + 64 * (row_s + kv_row / 2), 1e-3 * weights_s);
  EXPECT_TRUE(std::any_of(p.derivation.begin(), p.derivation.end(),
                          [](const std::string& l) { return l.find("tensor-core steps") != std::string::npos; }));
  // Four slots, or a V100, keep the warp kernels' term.
  for (const Plan& q : {all_slots("synthetic:qwen3-32b:Q4_K_M", 4, h100), all_slots("synthetic:qwen3-8b:Q4_K_M", 16, card("v100-32gb"))})
    EXPECT_FALSE(std::any_of(q.derivation.begin(), q.derivation.end(),
                             [](const std::string& l) { return l.find("tensor-core steps") != std::string::npos; }));
}

// Prefill of a mixture of experts: the routed experts' products (no f16 copies) take their stacked tensors' bytes
// once a 512-token step at the expert rate, the rest its FLOPs at the dense share; counted here from the tensor
// table and the shape (qwen3-30b-a3b: 48 layers, 8 of 128 experts of 768). Without the expert rate the old FLOP-only
// model comes back; the expert term is what brings qwen3-30b-a3b near its measured pp512 (18.3k tok/s, not 89k).
TEST(MemoryPlan, MoePrefillTakesTheExpertBytesOfAStep) {
  auto m = layout("synthetic:qwen3-30b-a3b:Q4_K_M");
  const HParams& hp = m->hparams();
  double expert_bytes = 0;
  for (int il = 0; il < hp.n_layer; ++il)
    for (LayerTensor t : {LayerTensor::FfnGateExps, LayerTensor::FfnUpExps, LayerTensor::FfnDownExps})
      expert_bytes += (double)m->layer(il)[t].bytes();
  const double expert_flops = 2.0 * 48 * 3 * 2048 * 8 * 768;
  PlanSettings s;
  const GpuSpec h200 = card("h200");
  const Plan p = make_plan(*m, h200, s);
  ASSERT_TRUE(p.fits);
  ASSERT_DOUBLE_EQ(p.f16_copy_share, 1.0);
  const double expert_s = expert_bytes / kPlanPromptRows / (h200.tflops * 1e12 * s.prefill_expert_bytes_per_flop);
  EXPECT_NEAR(p.prefill_expert_seconds, expert_s, 1e-15);
  EXPECT_NEAR(1.0 / p.prefill_tok_s, (p.prompt_flops_per_token - expert_flops) / (h200.tflops * 1e12 * s.prefill_copies_efficiency) + expert_s,
              1e-12);
  EXPECT_GT(p.prefill_tok_s, 12000);
  EXPECT_LT(p.prefill_tok_s, 25000);
  s.prefill_expert_bytes_per_flop = 0;
  const Plan flops_only = make_plan(*m, h200, s);
  EXPECT_EQ(flops_only.prefill_expert_seconds, 0.0);
  EXPECT_NEAR(1.0 / flops_only.prefill_tok_s, p.prompt_flops_per_token / (h200.tflops * 1e12 * s.prefill_copies_efficiency), 1e-12);
  // A dense model has no expert term.
  EXPECT_EQ(make_plan(*layout("synthetic:qwen3-8b:Q4_K_M"), h200, PlanSettings{}).prefill_expert_seconds, 0.0);
}

// --spec-type draft-mtp: the MTP head is an engine of its own that serve creates after the target's. On the GPU it
// holds its layer, its own copies of the embedding and the output matrix, a KV cache of the slots' positions plus
// each slot's drafts and a block, and compute buffers of the target's size; -ngl auto places what fits in the memory
// the target left. In host memory it shares the target's embedding and output matrix.
TEST(MemoryPlan, TheMtpHeadIsBilledAsTheEngineServeCreatesForIt) {
  auto m = layout("synthetic:qwen3.5-27b-mtp:Q4_K_M");
  auto head = Model::mtp_block(m);
  const HParams& hh = head->hparams();
  ASSERT_EQ(hh.n_layer, 1);
  PlanSettings s;
  s.n_ctx = 8192;
  s.n_parallel = 4;
  s.type_k = s.type_v = DType::Q8_0;
  s.speculative = true;
  const Plan without = make_plan(*m, card("v100-32gb"), s);
  s.mtp_head = head;
  s.draft_max = 5;
  const Plan p = make_plan(*m, card("v100-32gb"), s);
  EXPECT_TRUE(p.fits);
  EXPECT_EQ(p.n_gpu_layers, 65);
  EXPECT_EQ(p.draft_units, 2);
  EXPECT_EQ(p.draft_gpu_units, 2);
  const KvConfig hkv = planned_kv_config(hh, 8192 + 4 * (5 + 32), 512, 32, DType::Q8_0, DType::Q8_0);
  EXPECT_EQ(p.draft_positions, hkv.block_size * hkv.n_blocks);
  EXPECT_GE(p.draft_positions, 8192 + 4 * (5 + 32));
  const LayerSet all{0, 1, true, true};
  const double weights = (double)planned_gpu_weight_bytes(*head, all);
  EXPECT_GT(weights, (double)m->token_embd().bytes() + (double)m->output_bytes()) << "its own copies on the GPU";
  const double kv = (double)planned_gpu_kv_block_bytes(*head, all, hkv) * hkv.n_blocks;
  EXPECT_DOUBLE_EQ(p.gpu_bill.draft, weights + kv + gpu_work_bytes(512, hh.n_vocab, hh.n_ff, card("v100-32gb").memory_gib * kGiB));
  EXPECT_DOUBLE_EQ(p.gpu_bill.total(), without.gpu_bill.total() + p.gpu_bill.draft) << "nothing else changes";
  EXPECT_EQ(p.host_bill.draft, 0.0);
  EXPECT_DOUBLE_EQ(p.decode_tok_s, without.decode_tok_s);

  // A 24 GB card: the target fits whole, the head only in part (its output unit): it does not fit as asked, and the
  // serve command keeps -ngl auto (a count would place the whole head on the GPU).
  s.type_k = s.type_v = DType::F16;
  const Plan small = make_plan(*m, card("rtx4090"), s);
  EXPECT_EQ(small.n_gpu_layers, 65);
  EXPECT_EQ(small.draft_gpu_units, 1);
  EXPECT_FALSE(small.fits);
  EXPECT_GT(small.host_bill.draft, (double)head->layer_bytes(0)) << "its layer and the embedding, which the target keeps on the GPU";

  // All on the host: only the head's layer and its KV are its own.
  s.n_gpu_layers = 0;
  const Plan host = make_plan(*m, card("rtx4090"), s);
  EXPECT_EQ(host.draft_gpu_units, 0);
  EXPECT_EQ(host.gpu_bill.draft, 0.0);
  const KvConfig fkv = planned_kv_config(hh, 8192 + 4 * (5 + 32), 512, 32, DType::F16, DType::F16);
  const double kv_row = (double)(dtype_row_bytes(DType::F16, hh.kv_dim_k()) + dtype_row_bytes(DType::F16, hh.kv_dim_v()));
  EXPECT_DOUBLE_EQ(host.host_bill.draft, (double)head->layer_bytes(0) + kv_row * fkv.block_size * fkv.n_blocks);

  // A model without an MTP block has no head to plan.
  EXPECT_THROW(Model::mtp_block(layout("synthetic:qwen3.5-27b:Q4_K_M")), Error);
}

// gemma3-27b at -c 32768 -np 4 (f16 K and V, serve's -b 512 and blocks of 32): the 10 global layers keep the
// whole context, each of the 52 sliding layers a ring of 1024 + 512 - 1 positions (1536 in blocks) per slot,
// and the prompt-cache snapshots (52 layers x the 1024 positions before a boundary, 416 MiB each, two per
// slot within --cache-ram's 8 GiB) stay in host memory: the GPU's KV is 2560 + 2496 MiB (docs/performance.md
// compares it with llama.cpp's 5056 MiB for the same flags).
TEST(MemoryPlan, Gemma3_27bKeepsTheWindowOfSlidingLayers) {
  auto m = layout("synthetic:gemma3-27b:Q4_K_M");
  PlanSettings s;
  s.n_ctx = 32768;
  s.n_parallel = 4;
  const Plan p = make_plan(*m, card("h200"), s);
  EXPECT_EQ(p.n_gpu_layers, p.n_units);
  const double row = 2.0 * 16 * 128 * 2, pad = 4 * 256;  // K and V rows (16 heads x 128, f16); the GPU arena's slack
  EXPECT_EQ(p.kv.swa_ring, 1536);
  EXPECT_EQ(p.kv.swa_snapshot_blocks, 32);
  EXPECT_DOUBLE_EQ(p.gpu_bill.kv, 10 * 1024 * (32 * row + pad));
  EXPECT_DOUBLE_EQ(p.gpu_bill.swa, 4 * 52 * (1536 * row + pad));
  EXPECT_EQ(p.window_snapshots, 8);
  EXPECT_DOUBLE_EQ(p.window_snapshot_bytes, 52 * 1024 * row);
  EXPECT_DOUBLE_EQ(p.host_bill.snapshots, 8 * 52 * 1024 * row);
  EXPECT_DOUBLE_EQ(p.gpu_bill.snapshots, 0);
  const double mib = 1048576.0;
  EXPECT_NEAR((p.gpu_bill.kv + p.gpu_bill.swa) / mib, 2560 + 2496, 12) << "within the arena slack of llama.cpp's 5056 MiB";
  // The same layers all on the host (-ngl 0): the same bytes without the slack.
  s.n_gpu_layers = 0;
  const Plan h = make_plan(*m, card("h200"), s);
  EXPECT_DOUBLE_EQ(h.host_bill.kv + h.host_bill.swa, (2560.0 + 2496.0) * mib);
  // --cache-ram 1000: two snapshots; --no-prompt-cache: none.
  s.cache_ram_mib = 1000;
  EXPECT_EQ(make_plan(*m, card("h200"), s).window_snapshots, 2);
  s.prompt_cache = false;
  EXPECT_EQ(make_plan(*m, card("h200"), s).window_snapshots, 0);
}

TEST(MemoryPlan, RecommendationsAreComputedAlternativesThatFit) {
  auto m = layout("synthetic:qwen3-32b:Q8_0");
  PlanSettings s;
  s.n_ctx = 32768;
  s.n_parallel = 4;
  const GpuSpec g = card("rtx4090");
  Plan p = make_plan(*m, g, s);
  ASSERT_FALSE(p.fits);
  const auto spec = parse_synthetic_spec("synthetic:qwen3-32b:Q8_0");
  add_recommendations(p, *m, [&](const std::string& mix) {
    SyntheticSpec o = spec;
    o.mix = find_mix(mix);
    SyntheticLayout l = synthetic_layout(o);
    return Model::load(gguf::GgufFile::from_parts("x", std::move(l.metadata), std::move(l.tensors), nullptr));
  });
  bool quant = false;
  for (const std::string& r : p.recommendations) {
    if (r.find(" file (") == std::string::npos) continue;
    quant = true;
    EXPECT_NE(r.find("fits:"), std::string::npos) << r;
  }
  EXPECT_TRUE(quant);  // a 32B model fits a 24 GiB card at some smaller mix (Q3_K, Q2_K, ...)
  // A recurrent model is offered fewer state cells; each offer is a re-plan that says whether it fits.
  auto q35 = layout("synthetic:qwen3.5-27b:Q4_K_M");
  PlanSettings s35;
  s35.n_ctx = 8192;
  s35.type_k = s35.type_v = DType::Q8_0;
  Plan p35 = make_plan(*q35, card("v100-16gb"), s35);
  ASSERT_FALSE(p35.fits);
  add_recommendations(p35, *q35, nullptr);
  bool no_cache = false;
  for (const std::string& r : p35.recommendations) {
    if (r.rfind("--no-prompt-cache", 0) != 0) continue;
    no_cache = true;
    PlanSettings t = s35;
    t.prompt_cache = false;
    const Plan q = make_plan(*q35, card("v100-16gb"), t);
    EXPECT_NE(r.find(fmt::format("{}/{} units", q.n_gpu_layers, q.n_units)), std::string::npos) << r;
  }
  EXPECT_TRUE(no_cache);
  // A plan that fits gets none.
  Plan ok = make_plan(*m, card("h200"), s);
  add_recommendations(ok, *m, nullptr);
  EXPECT_TRUE(ok.recommendations.empty());
}

TEST(MemoryPlan, BadSettingsAreErrors) {
  auto m = layout("synthetic:tiny-qwen3:Q8_0");
  PlanSettings s;
  s.n_parallel = 0;
  EXPECT_THROW(make_plan(*m, card("t4"), s), Error);
  s = {};
  s.n_ctx = -1;
  EXPECT_THROW(make_plan(*m, card("t4"), s), Error);
  s = {};
  s.type_k = DType::Q4_K;
  EXPECT_THROW(make_plan(*m, card("t4"), s), Error);
  GpuSpec no_memory = card("t4");
  no_memory.memory_gib = -1;
  EXPECT_THROW(make_plan(*m, no_memory, PlanSettings{}), Error);
}

TEST(GpuTable, HasTheCardsTheIssueNamesWithSaneFigures) {
  for (const char* name : {"v100-16gb", "v100-32gb", "t4", "p40", "p100", "rtx2080ti", "rtx3090", "rtx4090", "rtx5090", "a10", "l4",
                           "l40s", "a100-40gb", "a100-80gb", "h100", "h200", "cpu"}) {
    const GpuSpec* g = find_gpu_spec(name);
    ASSERT_NE(g, nullptr) << name;
    EXPECT_GT(g->peak_gbs, 50) << name;
    EXPECT_GT(g->stream_fraction, 0.5) << name;
    EXPECT_LE(g->stream_fraction, 1.0) << name;
    EXPECT_GT(g->tflops, 0) << name;
    if (!g->host) { EXPECT_GE(g->cc_major, 6) << name; }
  }
  EXPECT_EQ(find_gpu_spec("V100-32GB"), find_gpu_spec("v100-32gb"));
  EXPECT_EQ(find_gpu_spec("v100"), nullptr);
  EXPECT_EQ(match_gpu_spec("Tesla V100-SXM2-32GB", 31.7)->name, "v100-32gb");
  EXPECT_EQ(match_gpu_spec("Tesla V100-PCIE-16GB", 15.8)->name, "v100-16gb");
  EXPECT_EQ(match_gpu_spec("NVIDIA A100-SXM4-80GB", 79.2)->name, "a100-80gb");
  EXPECT_EQ(match_gpu_spec("NVIDIA A10", 22.1)->name, "a10");
  EXPECT_EQ(match_gpu_spec("NVIDIA L40S", 44.5)->name, "l40s");
  EXPECT_EQ(match_gpu_spec("NVIDIA H200", 139.8)->name, "h200");
  EXPECT_EQ(match_gpu_spec("Radeon", 16), nullptr);
}

TEST(HfConfigShape, ConfigsGiveTheBuiltInShapesTensorTables) {
  const std::string dir = (std::filesystem::temp_directory_path() / "roofline_plan_hf").string();
  std::filesystem::create_directories(dir);
  const std::string qwen3 = dir + "/qwen3-8b.json", qwen35 = dir + "/qwen35.json";
  std::ofstream(qwen3) << R"({"architectures":["Qwen3ForCausalLM"],"model_type":"qwen3","hidden_size":4096,"num_hidden_layers":36,
    "num_attention_heads":32,"num_key_value_heads":8,"head_dim":128,"intermediate_size":12288,"vocab_size":151936,
    "max_position_embeddings":40960,"rope_theta":1000000,"rms_norm_eps":1e-6,"tie_word_embeddings":false})";
  std::ofstream(qwen35) << R"({"architectures":["Qwen3_5ForConditionalGeneration"],"model_type":"qwen3_5","text_config":{
    "model_type":"qwen3_5_text","hidden_size":5120,"num_hidden_layers":64,"num_attention_heads":24,"num_key_value_heads":4,
    "head_dim":256,"intermediate_size":17408,"vocab_size":248320,"max_position_embeddings":262144,"full_attention_interval":4,
    "linear_conv_kernel_dim":4,"linear_key_head_dim":128,"linear_value_head_dim":128,"linear_num_key_heads":16,
    "linear_num_value_heads":48,"partial_rotary_factor":0.25,"rope_theta":10000000,"tie_word_embeddings":false}})";
  for (auto [path, builtin] : {std::pair{qwen3, "qwen3-8b"}, std::pair{qwen35, "qwen3.5-27b"}}) {
    SyntheticSpec from_config, known;
    from_config.shape = shape_from_hf_config(path);
    known.shape = *find_model_shape(builtin);
    from_config.mix = known.mix = find_mix("Q4_K_M");
    const auto a = synthetic_layout(from_config).tensors, b = synthetic_layout(known).tensors;
    ASSERT_EQ(a.size(), b.size()) << path;
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].name, b[i].name);
      EXPECT_EQ(a[i].type, b[i].type) << a[i].name;
      EXPECT_EQ(a[i].n_bytes, b[i].n_bytes) << a[i].name;
    }
  }
  EXPECT_THROW(shape_from_hf_config(dir + "/missing.json"), Error);
  std::ofstream(dir + "/bad.json") << "{not json";
  EXPECT_THROW(shape_from_hf_config(dir + "/bad.json"), Error);
  std::ofstream(dir + "/gemma.json") << R"({"model_type":"gemma3"})";
  EXPECT_THROW(shape_from_hf_config(dir + "/gemma.json"), Error);
  std::ofstream(dir + "/nolayers.json") << R"({"model_type":"qwen3","hidden_size":64})";
  EXPECT_THROW(shape_from_hf_config(dir + "/nolayers.json"), Error);
}

// On a GPU: the planned byte counts are the CUDA backend's, and the plan's -ngl auto is what
// Engine::create offloads under the same --vram-limit.
TEST(GpuMemoryPlan, PlannedBytesAndAutoOffloadMatchTheEngine) {
  const auto devices = gpu_devices();
  if (devices.empty()) GTEST_SKIP() << "no CUDA GPU in this build or machine";
  auto model = Model::load(build_synthetic_model(parse_synthetic_spec("synthetic:tiny-qwen35:Q4_K_M")));
  const HParams& hp = model->hparams();
  GpuBackendOptions go;
  auto backend = make_gpu_backend(go);
  KvConfig kv;
  kv.block_size = 32;
  kv.n_blocks = 8;
  kv.type_k = DType::Q8_0;
  kv.type_v = DType::F16;
  for (int first = 0; first <= hp.n_layer; ++first) {
    const LayerSet set{first, hp.n_layer, first == 0, true};
    EXPECT_EQ(planned_gpu_weight_bytes(*model, set), backend->weight_bytes(*model, set)) << first;
    EXPECT_EQ(planned_gpu_kv_block_bytes(*model, set, kv), backend->kv_block_bytes(*model, set, kv)) << first;
    EXPECT_EQ(planned_gpu_state_cell_bytes(*model, set), backend->state_cell_bytes(*model, set)) << first;
  }
  // The MTP head (a one-layer model of its own: its layer, the embedding and the output matrix).
  auto mtp = Model::load(build_synthetic_model(parse_synthetic_spec("synthetic:tiny-qwen35-mtp:Q4_K_M")));
  auto head = Model::mtp_block(mtp);
  for (int first = 0; first <= 1; ++first) {
    const LayerSet set{first, 1, first == 0, true};
    EXPECT_EQ(planned_gpu_weight_bytes(*head, set), backend->weight_bytes(*head, set)) << "MTP head from unit " << first;
    EXPECT_EQ(planned_gpu_kv_block_bytes(*head, set, kv), backend->kv_block_bytes(*head, set, kv)) << "MTP head from unit " << first;
  }
  // Gemma 3's rings and window snapshots (the sliding layers leave the paged blocks).
  auto gemma = Model::load(build_synthetic_model(parse_synthetic_spec("synthetic:tiny-gemma3:Q8_0")));
  for (DType t : {DType::F16, DType::Q8_0}) {
    const KvConfig gkv = planned_kv_config(gemma->hparams(), 1024, 16, 16, t, t);
    ASSERT_GT(gkv.swa_snapshot_blocks, 0);
    for (int first = 0; first <= gemma->hparams().n_layer; ++first) {
      const LayerSet set{first, gemma->hparams().n_layer, first == 0, true};
      EXPECT_EQ(planned_gpu_kv_block_bytes(*gemma, set, gkv), backend->kv_block_bytes(*gemma, set, gkv)) << first;
      EXPECT_EQ(planned_gpu_swa_cell_bytes(*gemma, set, gkv), backend->swa_cell_bytes(*gemma, set, gkv)) << first;
    }
    const LayerSet all{0, gemma->hparams().n_layer, true, true};
    EXPECT_EQ(window_snapshot_bytes(*gemma, gkv), backend->swa_snapshot_bytes(*gemma, all, gkv));
  }
  backend.reset();
  // A --vram-limit that leaves room for about half the units.
  PlanSettings s;
  s.n_ctx = 2048;
  s.n_parallel = 2;
  s.type_k = s.type_v = DType::Q8_0;
  GpuSpec spec = *find_gpu_spec("h200");
  spec.memory_gib = devices[0].free_bytes / kGiB + s.cuda_context_gib;  // usable = free, as the engine sees it
  s.vram_limit_gib = 32;  // under 64 GiB, as the half limit below is: the same GEMM scratch in the work allowance
  const Plan all = make_plan(*model, spec, s);
  ASSERT_EQ(all.n_gpu_layers, all.n_units);
  const double overhead = all.gpu_bill.work + all.gpu_bill.margin;
  const double half = gpu_need_by_units(*model, all.n_units / 2, s, all.state_cells) + 1;
  s.vram_limit_gib = (overhead + half) / kGiB;
  const Plan p = make_plan(*model, spec, s);
  EngineOptions eo;
  eo.n_ctx = s.n_ctx;
  eo.n_seq_max = s.n_parallel;
  eo.n_state_snapshots = 2 * s.n_parallel;
  eo.type_k = eo.type_v = DType::Q8_0;
  eo.n_gpu_layers = EngineOptions::kGpuLayersAuto;
  eo.split_mode = EngineOptions::SplitMode::None;
  eo.vram_limit_gib = {s.vram_limit_gib};
  auto engine = Engine::create(model, eo);
  EXPECT_EQ(engine->gpu_units(), p.n_gpu_layers);
  EXPECT_EQ(p.n_gpu_layers, all.n_units / 2);
}
