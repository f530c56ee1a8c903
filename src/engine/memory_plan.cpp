// The planner behind `roofline plan`: memory bill, placement (placement.h, as Engine::create), rates
// and recommendations, all from the tensor table.
#include "engine/memory_plan.h"

#include <algorithm>
#include <cmath>

#include "backend/device_planes.h"
#include "core/error.h"
#include "engine/placement.h"
#include "engine/roofline_model.h"
#include "engine/sequence_memory.h"
#include "model/quant_mix.h"

namespace roofline {

namespace {

constexpr double kGiB = 1073741824.0;
constexpr size_t kDeviceAlign = 256;  // the CUDA weight arena's alignment (cuda_weights.cu)

// A matrix as the CUDA backend stores it: some types split into aligned planes (backend/device_planes.h), others
// as in the file.
size_t device_matrix_bytes(const Weight& w) {
  return w ? roofline::device_matrix_bytes(w.type(), w.tensor->n_elements(), w.bytes(), kDeviceAlign) : 0;
}

// Norms, biases and other small tensors: uploaded as f32.
size_t device_floats_bytes(const Weight& w) { return w ? ((size_t)w.tensor->n_elements() * 4 + 255) / 256 * 256 : 0; }

// The KV cache's value plane and block scales on the GPU (cuda_attention.cu's layout).
size_t kv_plane_bytes(DType type, int64_t n) {
  switch (type) {
    case DType::F32: return (size_t)n * 4;
    case DType::F16: case DType::BF16: return (size_t)n * 2;
    case DType::Q8_0: return (size_t)n + (size_t)n / 32 * 2;
    case DType::Q4_0: return (size_t)n / 2 + (size_t)n / 32 * 2;
    default: fail("KV cache type {} is not supported (use f16, bf16, q8_0 or q4_0)", dtype_name(type));
  }
}

// Host side (CpuBackend's accounting): weights as in the file, KV rows in their types, f32 states.
double host_weight_bytes(const Model& model, const LayerSet& s) {
  double n = 0;
  for (int il = s.begin; il < s.end; ++il) n += (double)model.layer_bytes(il);
  if (s.embedding) n += (double)model.token_embd().bytes();
  if (s.output && !(s.embedding && model.tied_embeddings())) n += (double)model.output_bytes();
  return n;
}

double kv_bytes_per_position_in(const Model& model, int begin, int end, DType tk, DType tv) {
  const HParams& hp = model.hparams();
  return (double)hp.count_layers(MixerKind::Attention, begin, end) *
         (double)(dtype_row_bytes(tk, hp.kv_dim_k()) + dtype_row_bytes(tv, hp.kv_dim_v()));
}

std::string gib(double bytes) { return fmt::format("{:.2f} GiB", bytes / kGiB); }

// Sliding layers among `layers` kept in rings (as the backends count them).
int ring_layers_in(const HParams& hp, const LayerSet& layers, const KvConfig& kv) {
  return kv.swa_ring > 0 ? hp.count_sliding_layers(layers.begin, layers.end) : 0;
}

}  // namespace

uint64_t planned_gpu_weight_bytes(const Model& model, const LayerSet& layers) {
  uint64_t n = 0;
  for (int il = layers.begin; il < layers.end; ++il) {
    const LayerWeights& L = model.layer(il);
    for (const PlannedTensor& t : layer_tensor_plan(model.arch(), model.hparams(), il)) {
      const Weight& w = L[t.rule->role];
      n += t.rule->use == TensorUse::Matrix ? device_matrix_bytes(w) : device_floats_bytes(w);
    }
  }
  if (layers.embedding) n += device_matrix_bytes(model.token_embd());
  if (layers.output) {
    if (!(layers.embedding && model.tied_embeddings())) n += device_matrix_bytes(model.output());
    n += device_floats_bytes(model.output_norm());
  }
  n += device_floats_bytes(model.rope_freqs());
  return n;
}

uint64_t planned_gpu_kv_block_bytes(const Model& model, const LayerSet& layers, const KvConfig& kv) {
  const HParams& hp = model.hparams();
  const int64_t nk = (int64_t)kv.block_size * hp.kv_dim_k(), nv = (int64_t)kv.block_size * hp.kv_dim_v();
  const int paged = hp.count_layers(MixerKind::Attention, layers.begin, layers.end) - ring_layers_in(hp, layers, kv);
  return (uint64_t)paged * (kv_plane_bytes(kv.type_k, nk) + kv_plane_bytes(kv.type_v, nv) + 4 * 256);
}

uint64_t planned_gpu_swa_cell_bytes(const Model& model, const LayerSet& layers, const KvConfig& kv) {
  const HParams& hp = model.hparams();
  const int64_t nk = (int64_t)kv.swa_ring * hp.kv_dim_k(), nv = (int64_t)kv.swa_ring * hp.kv_dim_v();
  return (uint64_t)ring_layers_in(hp, layers, kv) * (kv_plane_bytes(kv.type_k, nk) + kv_plane_bytes(kv.type_v, nv) + 4 * 256);
}

KvConfig planned_kv_config(const HParams& hp, int n_ctx, int n_batch, int block_size, DType type_k, DType type_v) {
  KvConfig kv;
  kv.block_size = block_size;
  kv.n_blocks = (n_ctx + block_size - 1) / block_size;
  kv.type_k = type_k;
  kv.type_v = type_v;
  if (hp.has_sliding_layers())
    kv.swa_ring = std::min((hp.sliding_window + n_batch - 1 + block_size - 1) / block_size * block_size, kv.n_blocks * block_size);
  if (kv.swa_ring > 0 && hp.count_layers(MixerKind::DeltaNet) == 0)
    kv.swa_snapshot_blocks = SequenceMemory::window_snapshot_blocks(hp.sliding_window, block_size, kv.swa_ring);
  return kv;
}

uint64_t window_snapshot_bytes(const Model& model, const KvConfig& kv) {
  const HParams& hp = model.hparams();
  return (uint64_t)ring_layers_in(hp, LayerSet{0, hp.n_layer, true, true}, kv) * kv.swa_snapshot_blocks * kv.block_size *
         (dtype_row_bytes(kv.type_k, hp.kv_dim_k()) + dtype_row_bytes(kv.type_v, hp.kv_dim_v()));
}

int window_snapshot_count(const Model& model, const KvConfig& kv, int n_parallel, double cache_ram_mib) {
  const uint64_t bytes = window_snapshot_bytes(model, kv);
  if (bytes == 0) return 0;
  const int wanted = 2 * n_parallel;
  if (cache_ram_mib < 0) return wanted;
  return (int)std::min<double>(wanted, std::floor(cache_ram_mib * 1048576.0 / (double)bytes));
}

uint64_t planned_gpu_state_cell_bytes(const Model& model, const LayerSet& layers) {
  const HParams& hp = model.hparams();
  return (uint64_t)hp.count_layers(MixerKind::DeltaNet, layers.begin, layers.end) * ((hp.delta_net.state_floats() + 3) / 4 * 16 + 256);
}

Plan make_plan(const Model& model, const GpuSpec& gpu, const PlanSettings& in) {
  const HParams& hp = model.hparams();
  Plan p;
  p.gpu = gpu;
  p.settings = in;
  PlanSettings& s = p.settings;
  if (s.n_ctx < 0) fail("-c {}: the context size cannot be negative (0: the model's, capped at 16384)", s.n_ctx);
  if (s.n_parallel < 1 || s.n_parallel > kMaxSlots) fail("-np {}: expected 1..{} slots", s.n_parallel, kMaxSlots);
  if (s.n_batch < 1) fail("-b {}: the batch size must be at least 1", s.n_batch);
  if (s.n_gpu_layers < -2) fail("-ngl {}: expected a count, auto or all", s.n_gpu_layers);
  if (!(s.vram_limit_gib >= 0)) fail("--vram-limit {}: expected a positive size in GiB", s.vram_limit_gib);
  if (!gpu.host && !(gpu.memory_gib > 0)) fail("GPU '{}' has no memory size", gpu.name);
  if (!(gpu.peak_gbs > 0)) fail("GPU '{}' has no bandwidth", gpu.name);
  for (DType t : {s.type_k, s.type_v}) kv_plane_bytes(t, 32);  // refuses unsupported KV types
  const int trained = hp.n_ctx_train > 0 ? hp.n_ctx_train : 4096;
  if (s.n_ctx == 0) s.n_ctx = std::min(trained, 16384);
  s.n_ctx = std::min(s.n_ctx, trained);  // serve caps -c at the trained context

  const KvConfig kv = planned_kv_config(hp, s.n_ctx, s.n_batch, s.kv_block_size, s.type_k, s.type_v);
  p.kv = kv;
  const bool recurrent = hp.count_layers(MixerKind::DeltaNet) > 0;
  p.state_cells = recurrent ? s.n_parallel + (s.prompt_cache ? 2 * s.n_parallel : 0) + (s.speculative ? s.n_parallel : 0) : 0;
  // Sliding-window rings: one per slot; with recurrent layers they go with the state cells and their snapshots.
  p.swa_ring_cells = kv.swa_ring > 0 ? (recurrent ? p.state_cells : s.n_parallel * (s.speculative ? 2 : 1)) : 0;
  p.window_snapshots = s.prompt_cache ? window_snapshot_count(model, kv, s.n_parallel, s.cache_ram_mib) : 0;
  p.window_snapshot_bytes = (double)window_snapshot_bytes(model, kv);
  p.n_units = hp.n_layer + 1;
  p.kv_bytes_per_position = kv_bytes_per_position(model, s.type_k, s.type_v);

  // Placement, as Engine::create does it for one GPU (placement.h).
  const double gpu_memory = gpu.memory_gib * kGiB;
  const double context = gpu.host ? 0 : s.cuda_context_gib * kGiB;
  double usable = gpu_memory - context;  // what the driver reports free
  if (s.vram_limit_gib > 0) usable = std::min(usable, s.vram_limit_gib * kGiB);
  const double scratch_gpu = s.vram_limit_gib > 0 ? std::min(gpu_memory, s.vram_limit_gib * kGiB) : gpu_memory;
  const double work = gpu_work_bytes(s.n_batch, hp.n_vocab, hp.n_ff, scratch_gpu);
  const double budget = gpu_budget_bytes(usable, s.margin_gib, work);
  auto gpu_set = [&](int first, int end) { return LayerSet{first, std::min(end, hp.n_layer), first == 0, end == p.n_units}; };
  auto cost = [&](int, int first, int end) {
    const LayerSet set = gpu_set(first, end);
    return (double)planned_gpu_weight_bytes(model, set) + (double)planned_gpu_kv_block_bytes(model, set, kv) * kv.n_blocks +
           (double)planned_gpu_state_cell_bytes(model, set) * p.state_cells + (double)planned_gpu_swa_cell_bytes(model, set, kv) * p.swa_ring_cells;
  };
  int units = 0;
  if (!gpu.host && s.n_gpu_layers != 0) units = choose_gpu_units(s.n_gpu_layers, p.n_units, {1.0}, {budget}, cost);
  p.n_gpu_layers = units;
  const int first_gpu_unit = p.n_units - units;

  // The bills.
  p.gpu_bill.device = gpu.host ? "GPU (none)" : fmt::format("GPU ({})", gpu.name);
  if (units > 0) {
    const LayerSet set = gpu_set(first_gpu_unit, p.n_units);
    p.gpu_bill.weights = (double)planned_gpu_weight_bytes(model, set);
    p.gpu_bill.kv = (double)planned_gpu_kv_block_bytes(model, set, kv) * kv.n_blocks;
    p.gpu_bill.state = (double)planned_gpu_state_cell_bytes(model, set) * p.state_cells;
    p.gpu_bill.swa = (double)planned_gpu_swa_cell_bytes(model, set, kv) * p.swa_ring_cells;
    p.gpu_bill.work = work;
    p.gpu_bill.margin = s.margin_gib * kGiB;
  }
  if (!gpu.host) {
    p.gpu_bill.context = context;
    p.gpu_bill.capacity = usable + context;
  }
  p.host_bill.device = "host";
  p.host_bill.capacity = gpu.host ? gpu.memory_gib * kGiB : s.host_memory_gib * kGiB;
  if (units < p.n_units) {
    const LayerSet set{0, std::min(first_gpu_unit, hp.n_layer), true, units == 0};
    p.host_bill.weights = host_weight_bytes(model, set);
    const double row = (double)(dtype_row_bytes(s.type_k, hp.kv_dim_k()) + dtype_row_bytes(s.type_v, hp.kv_dim_v()));
    const int rings = ring_layers_in(hp, set, kv);
    p.host_bill.kv = (kv_bytes_per_position_in(model, set.begin, set.end, s.type_k, s.type_v) - rings * row) * kv.block_size * kv.n_blocks;
    p.host_bill.swa = rings * row * kv.swa_ring * p.swa_ring_cells;
    p.host_bill.state = 4.0 * (double)hp.delta_net.state_floats() * hp.count_layers(MixerKind::DeltaNet, set.begin, set.end) * p.state_cells;
  }
  // The MTP head (--spec-type draft-mtp): serve creates its engine after the target's, with the target's -ngl,
  // --vram-limit and KV types, and a context of the slots' positions plus each slot's drafts and a block
  // (load_draft); its -ngl auto places what fits in the memory the target left.
  bool draft_fits = true;
  if (s.mtp_head) {
    const Model& head = *s.mtp_head;
    const HParams& hh = head.hparams();
    const KvConfig hkv = planned_kv_config(hh, s.n_ctx + s.n_parallel * (s.draft_max + s.kv_block_size), s.n_batch,
                                           s.kv_block_size, s.type_k, s.type_v);
    p.draft_units = hh.n_layer + 1;
    auto head_cost = [&](int, int first, int end) {
      const LayerSet set{first, std::min(end, hh.n_layer), first == 0, end == p.draft_units};
      return (double)planned_gpu_weight_bytes(head, set) + (double)planned_gpu_kv_block_bytes(head, set, hkv) * hkv.n_blocks;
    };
    const double head_work = gpu_work_bytes(s.n_batch, hh.n_vocab, hh.n_ff, scratch_gpu);
    double head_budget = 0;
    if (!gpu.host && s.n_gpu_layers != 0) {
      const double target_used = units > 0 ? cost(0, first_gpu_unit, p.n_units) + work : 0;
      double head_usable = gpu_memory - context - target_used;
      if (s.vram_limit_gib > 0) head_usable = std::min(head_usable, s.vram_limit_gib * kGiB);
      head_budget = gpu_budget_bytes(head_usable, s.margin_gib, head_work);
      p.draft_gpu_units = choose_gpu_units(s.n_gpu_layers, p.draft_units, {1.0}, {head_budget}, head_cost);
    }
    const int first_head_gpu = p.draft_units - p.draft_gpu_units;
    p.draft_positions = hkv.block_size * hkv.n_blocks;
    if (p.draft_gpu_units > 0) {
      const LayerSet set{first_head_gpu, hh.n_layer, first_head_gpu == 0, true};
      p.draft_weights += (double)planned_gpu_weight_bytes(head, set);
      p.draft_kv += (double)planned_gpu_kv_block_bytes(head, set, hkv) * hkv.n_blocks;
      p.draft_work = head_work;
      p.gpu_bill.draft = head_cost(0, first_head_gpu, p.draft_units) + head_work;
      draft_fits = head_cost(0, first_head_gpu, p.draft_units) <= head_budget;
    }
    if (p.draft_gpu_units < p.draft_units) {
      // In host memory the head shares the target's embedding and output matrix where the target keeps them there
      // (one mapping of the file, one packed copy per process), so only the rest is the head's own.
      const bool target_embedding_on_host = units < p.n_units, target_output_on_host = units == 0;
      const LayerSet set{0, std::min(first_head_gpu, hh.n_layer), !target_embedding_on_host,
                         p.draft_gpu_units == 0 && !target_output_on_host};
      const double w = host_weight_bytes(head, set);
      const double k = kv_bytes_per_position_in(head, set.begin, set.end, s.type_k, s.type_v) * p.draft_positions;
      p.draft_weights += w;
      p.draft_kv += k;
      p.host_bill.draft = w + k;
    }
  }
  // Window snapshots stay in host memory whichever device holds the layers (pinned for a GPU's).
  p.host_bill.snapshots = p.window_snapshot_bytes * p.window_snapshots;
  p.swa_bytes_per_ring = p.swa_ring_cells > 0 ? (p.gpu_bill.swa + p.host_bill.swa) / p.swa_ring_cells : 0;
  p.kv_bytes_total = p.gpu_bill.kv + p.host_bill.kv + p.gpu_bill.swa + p.host_bill.swa;
  p.kv_bytes_per_slot = p.kv_bytes_total / s.n_parallel;
  p.state_bytes_per_cell = p.state_cells > 0 ? (p.gpu_bill.state + p.host_bill.state) / p.state_cells : 0;
  const bool placement_fits = units == 0 || cost(0, first_gpu_unit, p.n_units) <= budget;
  const bool wants_all = s.n_gpu_layers < 0 || s.n_gpu_layers >= p.n_units;
  p.fits = placement_fits && draft_fits && p.host_bill.fits() &&
           (gpu.host || !wants_all || (units == p.n_units && p.draft_gpu_units == p.draft_units));

  // Decode: a token reads every weight once, its embedding row, the KV of its depth and the states.
  const GpuSpec* host = find_gpu_spec("cpu");
  const bool host_measured = s.host_read_gbs > 0;
  const double host_gbs = host_measured ? s.host_read_gbs : host->achievable_gbs();
  auto bytes_on = [&](int first_unit, int end_unit, double depth) {
    if (first_unit >= end_unit) return 0.0;
    const int b = std::min(first_unit, hp.n_layer), e = std::min(end_unit, hp.n_layer);
    double n = 0;
    for (int il = b; il < e; ++il) n += layer_decode_bytes(model, il);
    if (end_unit == p.n_units) n += (double)model.output_bytes();
    if (first_unit == 0) n += (double)dtype_row_bytes(model.token_embd().type(), hp.n_embd);
    const double row = (double)(dtype_row_bytes(s.type_k, hp.kv_dim_k()) + dtype_row_bytes(s.type_v, hp.kv_dim_v()));
    for (int il = b; il < e; ++il) n += kv_positions_read(hp, il, depth) * row;  // sliding layers: their window
    n += state_bytes_per_token(model, b, e);
    return n;
  };
  // The Q8_0 weights among them: our Q8_0 products stream closer to the bandwidth than the K-quant ones.
  auto q8_bytes_on = [&](int first_unit, int end_unit) {
    double n = 0;
    auto add = [&](const Weight& w, double share) {
      if (w && w.type() == DType::Q8_0) n += (double)w.bytes() * share;
    };
    for (int il = std::min(first_unit, hp.n_layer); il < std::min(end_unit, hp.n_layer); ++il)
      for (size_t t = 0; t < kLayerTensorCount; ++t) {
        const LayerTensor lt = (LayerTensor)t;
        const bool expert = lt == LayerTensor::FfnGateExps || lt == LayerTensor::FfnUpExps || lt == LayerTensor::FfnDownExps;
        add(model.layer(il)[lt], expert ? (double)hp.n_expert_used / hp.n_expert : 1.0);
      }
    if (end_unit == p.n_units && first_unit < end_unit) add(model.output(), 1.0);
    return n;
  };
  const double gpu_gbs = gpu.host ? host_gbs : gpu.achievable_gbs();
  const int gpu_layers = gpu.host ? 0 : std::max(0, hp.n_layer - first_gpu_unit);
  // The layers on the GPU by the kinds that add launches (gpu_recurrent_layer_us and after).
  const int gpu_recurrent = hp.count_layers(MixerKind::DeltaNet, hp.n_layer - gpu_layers, hp.n_layer);
  int gpu_moe = 0, gpu_shared = 0;
  for (int il = hp.n_layer - gpu_layers; il < hp.n_layer; ++il) {
    const LayerWeights& L = model.layer(il);
    gpu_moe += L[LayerTensor::FfnGateExps] || L[LayerTensor::FfnUpExps] ? 1 : 0;
    gpu_shared += L[LayerTensor::FfnUpShexp] ? 1 : 0;
  }
  const double gpu_layers_s = (gpu_layers * s.gpu_layer_us + gpu_recurrent * s.gpu_recurrent_layer_us + gpu_moe * s.gpu_moe_layer_us +
                               gpu_shared * s.gpu_shared_expert_us) * 1e-6;
  struct DecodeTime {
    double on_gpu = 0, on_host = 0, q8_on_gpu = 0;  // bytes
    double bound = 0, predicted = 0;  // seconds: the roofline's, and the model's
  };
  auto decode_time = [&](double depth) {
    DecodeTime t;
    t.on_gpu = gpu.host ? 0 : bytes_on(first_gpu_unit, p.n_units, depth);
    t.on_host = gpu.host ? bytes_on(0, p.n_units, depth) : bytes_on(0, first_gpu_unit, depth);
    t.q8_on_gpu = gpu.host ? 0 : q8_bytes_on(first_gpu_unit, p.n_units);
    t.bound = t.on_gpu / (gpu_gbs * 1e9) + t.on_host / (host_gbs * 1e9);
    t.predicted = (t.on_gpu - t.q8_on_gpu) / (gpu_gbs * 1e9 * s.gpu_stream_efficiency) +
                  t.q8_on_gpu / (gpu_gbs * 1e9 * s.gpu_q8_stream_efficiency) + gpu_layers_s +
                  t.on_host / (host_gbs * 1e9 * s.host_stream_efficiency);
    return t;
  };
  const DecodeTime t0 = decode_time(0);
  const double roofline = t0.bound > 0 ? 1.0 / t0.bound : 0.0;
  p.gpu_bytes_per_token = gpu.host ? 0 : t0.on_gpu;
  p.host_bytes_per_token = decode_bytes_per_token(model, 0, s.type_k, s.type_v) - p.gpu_bytes_per_token;
  p.decode_roofline_tok_s = roofline;
  p.decode_tok_s = t0.predicted > 0 ? 1.0 / t0.predicted : 0.0;
  const double slot_depth = (double)s.n_ctx / s.n_parallel;
  const DecodeTime t_full = decode_time(slot_depth);
  p.decode_tok_s_full_context = t_full.predicted > 0 ? 1.0 / t_full.predicted : 0.0;

  // Prefill: FLOPs of a token at the middle of a 512-token prompt (no logits but the last row's), at the card's
  // dense FP16 rate. A decode row's FLOPs (the batched rows below) include the output matrix.
  p.flops_per_token = flops_per_token(model, 256);
  p.prompt_flops_per_token = flops_per_token(model, 256, /*with_output=*/false);
  const double all_weights = host_weight_bytes(model, LayerSet{0, hp.n_layer, true, true});
  const double gpu_share = gpu.host ? 0 : std::min(1.0, p.gpu_bill.weights / std::max(all_weights, 1.0));
  // The f16 copies the GPU layers' prompt products would take, and what share of them the bill leaves room for.
  for (int il = std::min(first_gpu_unit, hp.n_layer); !gpu.host && il < hp.n_layer; ++il)
    for (const PlannedTensor& t : layer_tensor_plan(model.arch(), hp, il)) {
      const Weight& w = model.layer(il)[t.rule->role];
      if (w && t.rule->use == TensorUse::Matrix && !is_stacked_experts(t.rule->role) && w.type() != DType::F16)
        p.f16_copy_bytes += (double)w.tensor->n_elements() * 2;
    }
  double room = p.gpu_bill.capacity > 0 ? p.gpu_bill.capacity - p.gpu_bill.total() : 0;
  if (s.f16_copies_max_gib > 0) room = std::min(room, s.f16_copies_max_gib * 1073741824.0);
  p.f16_copy_share = s.f16_copies && p.f16_copy_bytes > 0 ? std::clamp(room / p.f16_copy_bytes, 0.0, 1.0) : 0;
  const double gpu_efficiency = p.f16_copy_share * s.prefill_copies_efficiency + (1 - p.f16_copy_share) * s.prefill_efficiency;
  const double gpu_flops = gpu.host ? 0 : gpu.tflops * 1e12 * gpu_efficiency;
  const bool host_compute_measured = s.host_tflops > 0;
  const double host_tflops = host_compute_measured ? s.host_tflops : host->tflops;
  const double host_flops = host_tflops * 1e12 * s.host_prefill_efficiency;
  // The routed experts apart: on the GPU at the expert rate (their bytes, once a 512-token step), on the host by FLOPs.
  const int gpu_first_layer = gpu.host ? hp.n_layer : std::min(first_gpu_unit, hp.n_layer);
  const double expert_flops_host = routed_expert_flops_per_token(model, 0, gpu_first_layer);
  const double expert_flops_gpu = routed_expert_flops_per_token(model, gpu_first_layer, hp.n_layer);
  const double expert_bytes_gpu = stacked_expert_bytes(model, gpu_first_layer, hp.n_layer);
  const double expert_rate = gpu.tflops * 1e12 * s.prefill_expert_bytes_per_flop;  // bytes/s
  const bool experts_by_bytes = expert_bytes_gpu > 0 && expert_rate > 0;
  const double dense_flops = p.prompt_flops_per_token - expert_flops_host - (experts_by_bytes ? expert_flops_gpu : 0.0);
  p.prefill_expert_seconds = experts_by_bytes ? expert_bytes_gpu / kPlanPromptRows / expert_rate : 0.0;
  const double prefill_seconds = dense_flops * (gpu_share / std::max(gpu_flops, 1.0) + (1 - gpu_share) / host_flops) +
                                 expert_flops_host / host_flops + p.prefill_expert_seconds;
  p.prefill_tok_s = 1.0 / prefill_seconds;

  // Every slot generating at once: a step reads the weights once for all of them; each row after the
  // first adds its FLOPs (and its own KV and state bytes, at a quarter of a slot's depth on average).
  const DecodeTime t_mid = decode_time(slot_depth / 2);
  const double row_flops_s = gpu_share * p.flops_per_token / std::max(gpu.fp32_tflops * 1e12 * s.batched_row_efficiency, 1.0) +
                             (1 - gpu_share) * p.flops_per_token / host_flops;
  const double row_extra_s = row_flops_s + (t_mid.predicted - t0.predicted);
  double step_all = t0.predicted + (s.n_parallel - 1) * row_extra_s;
  bool batched_known = !gpu.host && gpu.fp32_tflops > 0;
  // More than 8 rows on a card with the tensor-core kernels (batched_hopper / batched_mma): the weights once, then
  // each row its FLOPs and layer time, its KV at half a slot's depth and its recurrent state.
  const bool tensor_rows = !gpu.host && s.n_parallel > 8 && gpu.tflops > 0 && gpu.cc_major * 10 + gpu.cc_minor >= 75;
  const PlanSettings::BatchedDecodeTerms& bt = gpu.cc_major == 9 ? s.batched_hopper : s.batched_mma;
  double batched_weights_s = 0, batched_row_s = 0;
  if (tensor_rows) {
    const double state_gpu = state_bytes_per_token(model, hp.n_layer - gpu_layers, hp.n_layer);
    const double expert_share = hp.n_expert > 0 ? (double)hp.n_expert_used / hp.n_expert : 0.0;
    const double experts_touched = 1.0 - std::pow(1.0 - expert_share, s.n_parallel);
    double weights_rate = gpu_gbs * 1e9 * bt.stream_efficiency;
    if (bt.dequant_bytes_per_fp32_flop > 0 && gpu.fp32_tflops > 0)
      weights_rate = std::min(weights_rate, gpu.fp32_tflops * 1e12 * bt.dequant_bytes_per_fp32_flop);
    batched_weights_s = (t0.on_gpu - state_gpu - expert_bytes_gpu * expert_share) / weights_rate +
                        expert_bytes_gpu * experts_touched / (gpu_gbs * 1e9 * s.batched_expert_stream_efficiency) +
                        gpu_layers * bt.layer_us * 1e-6 + t0.on_host / (host_gbs * 1e9 * s.host_stream_efficiency);
    batched_row_s = gpu_share * p.flops_per_token / (gpu.tflops * 1e12 * bt.tensor_efficiency) + gpu_layers * bt.row_layer_us * 1e-6 +
                    (1 - gpu_share) * p.flops_per_token / host_flops + state_gpu / (gpu_gbs * 1e9 * s.gpu_stream_efficiency) +
                    (t_mid.predicted - t0.predicted);
    step_all = batched_weights_s + s.n_parallel * batched_row_s;
    batched_known = true;
  }
  p.decode_tok_s_all_slots = batched_known && step_all > 0 ? s.n_parallel / step_all : 0.0;

  auto& d = p.derivation;
  if (gpu.host) {
    d.push_back(fmt::format("decode roofline: {:.1f} GB/s ({}) / {:.2f} GB per token = {:.1f} tok/s", host_gbs,
                            host_measured ? std::string("measured") : fmt::format("{:.0f} GB/s peak x {:.2f} streaming", host->peak_gbs, host->stream_fraction),
                            p.host_bytes_per_token / 1e9, roofline));
  } else {
    d.push_back(fmt::format("bytes a token reads at depth 0: {:.2f} GB on the GPU{}", p.gpu_bytes_per_token / 1e9,
                            p.host_bytes_per_token > 0 ? fmt::format(", {:.3f} GB on the host", p.host_bytes_per_token / 1e9) : ""));
    d.push_back(fmt::format("GPU read bandwidth: {:.0f} GB/s peak x {:.2f} ({}) = {:.0f} GB/s", gpu.peak_gbs, gpu.stream_fraction,
                            gpu.measured ? "measured" : "streaming fraction", gpu.achievable_gbs()));
    if (units < p.n_units)
      d.push_back(host_measured ? fmt::format("host read bandwidth: {:.1f} GB/s (measured)", host_gbs)
                                : fmt::format("host read bandwidth: {:.1f} GB/s (the `cpu` entry: {:.1f} GB/s peak x {:.2f})", host_gbs,
                                              host->peak_gbs, host->stream_fraction));
    d.push_back(fmt::format("decode roofline: 1 / ({:.2f} GB / {:.0f} GB/s{}) = {:.1f} tok/s", p.gpu_bytes_per_token / 1e9,
                            gpu.achievable_gbs(),
                            p.host_bytes_per_token > 0 ? fmt::format(" + {:.3f} GB / {:.1f} GB/s", p.host_bytes_per_token / 1e9, host_gbs) : "",
                            roofline));
  }
  double slot_kv_read = 0;  // KV a token reads at a full slot's depth (sliding layers: their window)
  for (int il = 0; il < hp.n_layer; ++il)
    slot_kv_read += kv_positions_read(hp, il, slot_depth) *
                    (double)(dtype_row_bytes(s.type_k, hp.kv_dim_k()) + dtype_row_bytes(s.type_v, hp.kv_dim_v()));
  std::string terms;
  if (t0.on_gpu > t0.q8_on_gpu)
    terms += fmt::format("{:.2f} GB / ({:.0f} GB/s x {:.2f})", (t0.on_gpu - t0.q8_on_gpu) / 1e9, gpu_gbs, s.gpu_stream_efficiency);
  if (t0.q8_on_gpu > 0)
    terms += fmt::format("{}{:.2f} GB of Q8_0 / ({:.0f} GB/s x {:.2f})", terms.empty() ? "" : " + ", t0.q8_on_gpu / 1e9, gpu_gbs,
                         s.gpu_q8_stream_efficiency);
  if (gpu_layers > 0) terms += fmt::format(" + {} layers x {:.0f} us", gpu_layers, s.gpu_layer_us);
  if (gpu_recurrent > 0 && s.gpu_recurrent_layer_us > 0) terms += fmt::format(" + {} DeltaNet x {:.1f} us", gpu_recurrent, s.gpu_recurrent_layer_us);
  if (gpu_moe > 0 && s.gpu_moe_layer_us > 0) terms += fmt::format(" + {} MoE x {:.1f} us", gpu_moe, s.gpu_moe_layer_us);
  if (gpu_shared > 0 && s.gpu_shared_expert_us > 0) terms += fmt::format(" + {} shared experts x {:.1f} us", gpu_shared, s.gpu_shared_expert_us);
  if (t0.on_host > 0)
    terms += fmt::format("{}{:.3f} GB / ({:.1f} GB/s x {:.2f})", terms.empty() ? "" : " + ", t0.on_host / 1e9, host_gbs,
                         s.host_stream_efficiency);
  d.push_back(fmt::format("decode predicted: 1 / ({}) = {:.1f} tok/s (one sequence, short context; the shares and the per-layer time "
                          "are our kernels' on the H200); at depth {:.0f} (a full slot: +{:.2f} GB of KV per token) {:.1f} tok/s",
                          terms, p.decode_tok_s, slot_depth, slot_kv_read / 1e9, p.decode_tok_s_full_context));
  if (tensor_rows)
    d.push_back(fmt::format("all {} slots generating (tensor-core steps): a step streams the weights once ({:.1f} ms: {:.2f} of the "
                            "bandwidth{} and {:.0f} us a layer) and each row adds {:.2f} ms ({:.1f} GFLOP at {:.2f} of {:.0f} TFLOPS dense "
                            "FP16, {:.2f} us a layer{}) = {:.1f} tok/s in all, {:.1f} per slot (fitted on {})",
                            s.n_parallel, 1e3 * batched_weights_s, bt.stream_efficiency,
                            bt.dequant_bytes_per_fp32_flop > 0 && gpu.fp32_tflops > 0 &&
                                    gpu.fp32_tflops * 1e12 * bt.dequant_bytes_per_fp32_flop < gpu_gbs * 1e9 * bt.stream_efficiency
                                ? fmt::format(", capped at {:.0f} GB/s by dequantizing on {:.0f} FP32 TFLOPS",
                                              gpu.fp32_tflops * 1e3 * bt.dequant_bytes_per_fp32_flop, gpu.fp32_tflops)
                                : std::string(),
                            bt.layer_us, 1e3 * batched_row_s,
                            p.flops_per_token / 1e9, bt.tensor_efficiency, gpu.tflops, bt.row_layer_us,
                            std::string(t_mid.predicted > t0.predicted ? ", its KV" : "") +
                                (state_bytes_per_token(model, hp.n_layer - gpu_layers, hp.n_layer) > 0 ? ", its recurrent state" : ""),
                            p.decode_tok_s_all_slots,
                            p.decode_tok_s_all_slots / s.n_parallel,
                            gpu.cc_major == 9 ? "the warpgroup kernel on an H100" : "the mma.sync kernel and f16 copies on an H200"));
  else if (s.n_parallel > 1 && batched_known)
    d.push_back(fmt::format("all {} slots generating: a step reads the weights once ({:.1f} ms) and each further row adds {:.1f} ms "
                            "({:.1f} GFLOP at {:.2f} of {:.1f} FP32 TFLOPS{}) = {:.1f} tok/s in all, {:.1f} per slot",
                            s.n_parallel, 1e3 * t0.predicted, 1e3 * row_extra_s, p.flops_per_token / 1e9, s.batched_row_efficiency,
                            gpu.fp32_tflops, t_mid.predicted > t0.predicted ? ", and its KV" : "", p.decode_tok_s_all_slots,
                            p.decode_tok_s_all_slots / s.n_parallel));
  const std::string host_rate = fmt::format("{:.2f} TFLOPS ({}) x {:.2f} (the products' share of a CPU prompt step)", host_tflops,
                                            host_compute_measured ? "this CPU's products, measured" : "the `cpu` entry's rough figure",
                                            s.host_prefill_efficiency);
  if (gpu.host)
    d.push_back(fmt::format("prefill predicted: {:.1f} GFLOP per token; {} = {:.0f} tok/s", p.prompt_flops_per_token / 1e9, host_rate,
                            p.prefill_tok_s));
  else
    d.push_back(fmt::format("prefill predicted: {:.1f} GFLOP per token; {:.0f} TFLOPS dense FP16 x {:.2f} (our prefill's share, measured "
                            "on the H200: {:.2f} with f16 copies of the weights, {:.2f} without; {}){}{} = {:.0f} tok/s",
                            p.prompt_flops_per_token / 1e9, gpu.tflops, gpu_efficiency, s.prefill_copies_efficiency, s.prefill_efficiency,
                            !s.f16_copies ? std::string("--f16-copies off")
                            : p.f16_copy_share >= 1 ? fmt::format("the copies, {:.1f} GiB, fit in what the bill leaves", p.f16_copy_bytes / 1073741824.0)
                                                    : fmt::format("{:.0f}% of the copies' {:.1f} GiB fit in what the bill leaves", 100 * p.f16_copy_share,
                                                                  p.f16_copy_bytes / 1073741824.0),
                            gpu_share < 1 ? fmt::format(", {:.0f}% of the weights on the GPU, the rest at {}", 100 * gpu_share, host_rate) : "",
                            p.prefill_expert_seconds > 0
                                ? fmt::format("; the routed experts' {:.1f} GFLOP apart: their {:.2f} GB, dequantized once a {}-token step, at "
                                              "{:.0f} GB/s (their kernel's rate on this card's FP16 compute) = {:.1f} us a token",
                                              expert_flops_gpu / 1e9, expert_bytes_gpu / 1e9, kPlanPromptRows, expert_rate / 1e9,
                                              p.prefill_expert_seconds * 1e6)
                                : std::string(),
                            p.prefill_tok_s));
  return p;
}

void add_recommendations(Plan& plan, const Model& model, const ModelForMix& model_for_mix) {
  if (plan.fits) return;
  auto& out = plan.recommendations;
  const PlanSettings base = plan.settings;
  auto describe = [](const Plan& q) {
    return fmt::format("{} {}/{} units on the GPU, decode ~{:.1f} tok/s", q.fits ? "fits:" : "does not fit:", q.n_gpu_layers,
                       q.n_units, q.decode_tok_s);
  };
  // KV cache in q8_0.
  if (base.type_k != DType::Q8_0 && base.type_k != DType::Q4_0) {
    PlanSettings s = base;
    s.type_k = s.type_v = DType::Q8_0;
    const Plan q = make_plan(model, plan.gpu, s);
    out.push_back(fmt::format("-ctk q8_0 -ctv q8_0 (KV {} instead of {}): {}", gib(q.kv_bytes_total), gib(plan.kv_bytes_total), describe(q)));
  }
  // The largest context that fits, in steps of 1024 positions.
  {
    int lo = 0, hi = base.n_ctx / 1024;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      PlanSettings s = base;
      s.n_ctx = mid * 1024;
      if (make_plan(model, plan.gpu, s).fits) lo = mid;
      else hi = mid - 1;
    }
    if (lo > 0 && lo * 1024 < base.n_ctx) {
      PlanSettings s = base;
      s.n_ctx = lo * 1024;
      out.push_back(fmt::format("-c {} ({} positions per slot): {}", s.n_ctx, s.n_ctx / base.n_parallel, describe(make_plan(model, plan.gpu, s))));
    }
  }
  // Fewer slots (recurrent models keep a state per slot and two snapshots).
  if (plan.state_cells > 0)
    for (int np = base.n_parallel - 1; np >= 1; --np) {
      PlanSettings s = base;
      s.n_parallel = np;
      const Plan q = make_plan(model, plan.gpu, s);
      if (q.fits || np == 1) {
        out.push_back(fmt::format("-np {} (recurrent state {}): {}", np, gib(q.gpu_bill.state + q.host_bill.state), describe(q)));
        break;
      }
    }
  // Recurrent models: no prompt-cache snapshots (serve --no-prompt-cache) keeps one state per slot.
  if (plan.state_cells > 0 && base.prompt_cache) {
    PlanSettings s = base;
    s.prompt_cache = false;
    const Plan q = make_plan(model, plan.gpu, s);
    out.push_back(fmt::format("--no-prompt-cache (recurrent state {} instead of {}; a repeated prompt prefix is recomputed): {}",
                              gib(q.gpu_bill.state + q.host_bill.state), gib(plan.gpu_bill.state + plan.host_bill.state), describe(q)));
  }
  // Smaller quantization mixes: the largest that fits.
  if (model_for_mix) {
    std::vector<std::pair<double, std::string>> mixes;
    for (const QuantMix& m : quant_mixes()) {
      auto other = model_for_mix(m.name);
      if (!other) continue;
      double bytes = 0;
      for (int il = 0; il < other->hparams().n_layer; ++il) bytes += (double)other->layer_bytes(il);
      bytes += (double)other->output_bytes();
      PlanSettings with_head = base;
      if (base.mtp_head) with_head.mtp_head = Model::mtp_block(other);  // the head in that mix too
      const Plan q = make_plan(*other, plan.gpu, with_head);
      if (q.fits) mixes.push_back({bytes, fmt::format("a {} file ({:.2f} GiB of weights): {}", m.name, bytes / kGiB, describe(q))});
    }
    std::sort(mixes.begin(), mixes.end());
    if (!mixes.empty()) out.push_back(mixes.back().second);
  }
  if (plan.n_gpu_layers > 0 && plan.n_gpu_layers < plan.n_units)
    out.push_back(fmt::format("as asked, -ngl auto puts {}/{} units on the GPU and the rest on the host: decode ~{:.1f} tok/s",
                              plan.n_gpu_layers, plan.n_units, plan.decode_tok_s));
  if (out.empty()) out.push_back("nothing smaller tried here fits this card: use a card with more memory, or several GPUs (-sm layer)");
}

int serve_batch_size(const Model& model, const GpuSpec& gpu, PlanSettings settings) {
  const int fallback = settings.n_batch;
  if (gpu.host || fallback >= kLargeServeBatch) return fallback;
  settings.n_gpu_layers = -1;  // auto: fits means every unit found room
  const double copies = make_plan(model, gpu, settings).f16_copy_share;
  settings.n_batch = kLargeServeBatch;
  const Plan large = make_plan(model, gpu, settings);
  return large.fits && large.f16_copy_share >= copies ? kLargeServeBatch : fallback;
}

}  // namespace roofline
