// The roofline of decode: tok/s <= read bandwidth / bytes a token reads, where a token reads every
// weight once (layers and output matrix; of a mixture of experts only its n_expert_used experts),
// one row of the token embedding, the KV cache of the attention layers up to its depth (sliding-window
// layers: at most their window), and the recurrent state of the DeltaNet layers (read and written
// once: counted twice). bench prints measured speed against this bound.
#pragma once

#include <cstdint>

#include "formats/dtype.h"
#include "model/model.h"

namespace roofline {

// Weight bytes one decode token reads in layer il: all of them, of a mixture of experts' stacked
// experts only n_expert_used.
double layer_decode_bytes(const Model& model, int il);
// Bytes one decode token reads at KV depth `depth` (positions already cached).
double decode_bytes_per_token(const Model& model, double depth, DType type_k, DType type_v);
// KV bytes per cached position across the attention layers.
double kv_bytes_per_position(const Model& model, DType type_k, DType type_v);
// Cached positions layer il reads at KV depth `depth`: all of them, or at most its window (gemma3's
// sliding layers); 0 for layers without KV.
double kv_positions_read(const HParams& hp, int il, double depth);
// Recurrent-state bytes one token moves in layers [layer_begin, layer_end) (read + write).
double state_bytes_per_token(const Model& model, int layer_begin, int layer_end);
// Matmul and attention FLOPs of one token at KV depth `depth`; with_output: the output matrix's product too
// (a decode row computes logits; a prompt's rows do not, but its last, which a per-token rate leaves out).
double flops_per_token(const Model& model, double depth, bool with_output = true);
// Of those, the routed experts' products in layers [layer_begin, layer_end) (n_expert_used experts a token; 0
// without a mixture of experts), and the bytes of those layers' stacked expert tensors.
double routed_expert_flops_per_token(const Model& model, int layer_begin, int layer_end);
double stacked_expert_bytes(const Model& model, int layer_begin, int layer_end);

// Read bandwidth of host memory in GB/s (1e9 bytes/s): n_threads streaming over a buffer much larger
// than the caches, best of a few passes.
double measure_host_read_bandwidth(int n_threads, size_t bytes = size_t(1) << 30);
// Tests and fuzz harnesses that run bench or plan in-process: probe this many bytes instead (0: as asked).
// The figure is then the caches', not the memory's; it only keeps instrumented builds quick.
void set_host_read_probe_bytes_for_test(size_t bytes);

}  // namespace roofline
