// Bytes, FLOPs and host bandwidth for the roofline.
#include "engine/roofline_model.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "core/thread_pool.h"

namespace roofline {

double kv_bytes_per_position(const Model& model, DType type_k, DType type_v) {
  const HParams& hp = model.hparams();
  return (double)hp.count_layers(MixerKind::Attention) *
         (double)(dtype_row_bytes(type_k, hp.kv_dim_k()) + dtype_row_bytes(type_v, hp.kv_dim_v()));
}

double kv_positions_read(const HParams& hp, int il, double depth) {
  if (!hp.has_kv(il)) return 0;
  const int window = hp.attention_window(il);
  return window > 0 ? std::min(depth, (double)window) : depth;
}

double state_bytes_per_token(const Model& model, int layer_begin, int layer_end) {
  const HParams& hp = model.hparams();
  return 2.0 * 4.0 * (double)hp.delta_net.state_floats() * hp.count_layers(MixerKind::DeltaNet, layer_begin, layer_end);
}

namespace {
// Bytes of layer il's stacked expert tensors (0 without them).
double layer_expert_bytes(const Model& model, int il) {
  const LayerWeights& L = model.layer(il);
  double bytes = 0;
  for (LayerTensor t : {LayerTensor::FfnGateExps, LayerTensor::FfnUpExps, LayerTensor::FfnDownExps})
    if (L[t]) bytes += (double)L[t].bytes();
  return bytes;
}
}  // namespace

double layer_decode_bytes(const Model& model, int il) {
  const HParams& hp = model.hparams();
  double bytes = (double)model.layer_bytes(il);
  if (!hp.is_moe()) return bytes;
  // A token reads n_expert_used of the n_expert stacked experts.
  return bytes - layer_expert_bytes(model, il) * (hp.n_expert - hp.n_expert_used) / hp.n_expert;
}

double decode_bytes_per_token(const Model& model, double depth, DType type_k, DType type_v) {
  const HParams& hp = model.hparams();
  double bytes = (double)model.output_bytes();
  for (int il = 0; il < hp.n_layer; ++il) bytes += layer_decode_bytes(model, il);
  bytes += (double)dtype_row_bytes(model.token_embd().type(), hp.n_embd);
  const double row = (double)(dtype_row_bytes(type_k, hp.kv_dim_k()) + dtype_row_bytes(type_v, hp.kv_dim_v()));
  for (int il = 0; il < hp.n_layer; ++il) bytes += row * kv_positions_read(hp, il, depth);
  bytes += state_bytes_per_token(model, 0, hp.n_layer);
  return bytes;
}

double flops_per_token(const Model& model, double depth, bool with_output) {
  const HParams& hp = model.hparams();
  const int n_attn = hp.count_layers(MixerKind::Attention), n_delta = hp.count_layers(MixerKind::DeltaNet);
  const DeltaNetDims& d = hp.delta_net;
  double weights = with_output ? (double)hp.n_embd * hp.n_vocab : 0.0;  // output matrix
  if (hp.is_moe())  // the router and the shared expert (the k routed experts below)
    weights += (double)hp.n_layer * hp.n_embd * (hp.n_expert + 3.0 * hp.n_ff_shexp);
  else
    weights += (double)hp.n_layer * 3.0 * hp.n_embd * hp.n_ff;
  weights += (double)n_attn * ((double)hp.n_embd * (hp.q_dim() * (hp.attn_output_gate ? 2 : 1) + hp.kv_dim_k() + hp.kv_dim_v()) +
                               (double)hp.n_head * hp.head_dim_v * hp.n_embd);
  weights += (double)n_delta * (double)hp.n_embd * (d.conv_dim() + 2.0 * d.value_dim() + 2.0 * d.n_v_heads);
  double attended = 0;  // keys attended over the attention layers
  for (int il = 0; il < hp.n_layer; ++il) attended += kv_positions_read(hp, il, depth + 1);
  const double attention = (double)hp.n_head * (hp.head_dim_k + hp.head_dim_v) * attended;
  const double delta_rule = (double)n_delta * 3.0 * d.ssm_state_floats();  // decay + delta update, output
  return 2.0 * (weights + attention + delta_rule) + routed_expert_flops_per_token(model, 0, hp.n_layer);
}

double routed_expert_flops_per_token(const Model& model, int layer_begin, int layer_end) {
  const HParams& hp = model.hparams();
  if (!hp.is_moe()) return 0;
  double flops = 0;
  for (int il = std::max(0, layer_begin); il < std::min(layer_end, hp.n_layer); ++il) {
    const LayerWeights& L = model.layer(il);
    if (L[LayerTensor::FfnGateExps] || L[LayerTensor::FfnUpExps])
      flops += 2.0 * 3.0 * (double)hp.n_embd * hp.n_expert_used * hp.n_ff_exp;
  }
  return flops;
}

double stacked_expert_bytes(const Model& model, int layer_begin, int layer_end) {
  double bytes = 0;
  for (int il = std::max(0, layer_begin); il < std::min(layer_end, model.hparams().n_layer); ++il) bytes += layer_expert_bytes(model, il);
  return bytes;
}

namespace {
std::atomic<size_t> host_probe_bytes_for_test{0};
}  // namespace

void set_host_read_probe_bytes_for_test(size_t bytes) { host_probe_bytes_for_test = bytes; }

double measure_host_read_bandwidth(int n_threads, size_t bytes) {
  if (const size_t b = host_probe_bytes_for_test.load(); b > 0) bytes = b;
  ThreadPool pool(n_threads);
  const size_t n = bytes / sizeof(uint64_t);
  std::unique_ptr<uint64_t[]> buffer(new uint64_t[n]);
  pool.parallel_for(64, [&](size_t c) {
    const size_t b = n * c / 64, e = n * (c + 1) / 64;
    for (size_t i = b; i < e; ++i) buffer[i] = i * 0x9e3779b97f4a7c15ull;
  });
  double best = 0;
  std::vector<uint64_t> sinks(pool.size() * 8);
  for (int pass = 0; pass < 4; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.run_on_all([&](int t, int nt) {
      const size_t b = n * t / nt, e = n * (t + 1) / nt;
      uint64_t acc0 = 0, acc1 = 0, acc2 = 0, acc3 = 0;
      for (size_t i = b; i + 4 <= e; i += 4) {
        acc0 ^= buffer[i];
        acc1 ^= buffer[i + 1];
        acc2 ^= buffer[i + 2];
        acc3 ^= buffer[i + 3];
      }
      sinks[(size_t)t * 8] = acc0 ^ acc1 ^ acc2 ^ acc3;
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, (double)(n * sizeof(uint64_t)) / s / 1e9);
  }
  volatile uint64_t keep = 0;
  for (uint64_t v : sinks) keep = keep ^ v;
  (void)keep;
  return best;
}

}  // namespace roofline
