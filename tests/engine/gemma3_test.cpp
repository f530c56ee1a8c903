// Gemma 3 on the CPU: hyperparameters read as llama.cpp reads them (sliding pattern, per-layer RoPE
// base and scale, attention scale, embedding scale), the real 27B layout with llama.cpp's Q4_K_M mix,
// and the forward pass against the double reference with a window shorter than the sequence, fed in
// every chunking (decode one by one, ragged prefill chunks, one prefill), with small KV blocks so the
// window's edge moves across blocks; a control showing the window changes the logits; the sliding
// layers' memory bounded by the window (rings per sequence), with forks and prompt caching.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/gpu_table.h"
#include "engine/memory_plan.h"
#include "engine/roofline_model.h"
#include "model/model_file.h"
#include "model/synthetic.h"
#include "reference_forward.h"
#include "test_util.h"

using namespace roofline;

namespace {

std::vector<int32_t> tokens_for(int n, int n_vocab, int salt = 0) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((int32_t)((i * 173 + 11 + salt * 31) % n_vocab));
  return t;
}

double nmse(const float* got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return num / den;
}

// The largest NMSE over every position of the engine's logits against the reference's.
double worst_nmse(std::shared_ptr<const Model> model, const EngineOptions& o, const std::vector<int32_t>& tokens,
                  DType ref_k = DType::F32, DType ref_v = DType::F32) {
  auto engine = Engine::create(model, o);
  const int seq = engine->memory().create_sequence();
  const auto logits = engine->eval(seq, tokens, true);
  test::ReferenceForward ref(*model);
  ref.set_kv_types(ref_k, ref_v);
  double worst = 0;
  const int n_vocab = model->hparams().n_vocab;
  for (size_t i = 0; i < tokens.size(); ++i)
    worst = std::max(worst, nmse(logits.data() + i * n_vocab, ref.step(tokens[i])));
  return worst;
}

// The synthetic file with its metadata edited.
std::shared_ptr<gguf::GgufFile> edited(const std::shared_ptr<const gguf::GgufFile>& good, void (*edit)(gguf::Metadata&)) {
  gguf::Metadata md = good->metadata();
  edit(md);
  std::vector<gguf::TensorInfo> tensors = good->tensors();
  return gguf::GgufFile::from_parts("edited.gguf", std::move(md), std::move(tensors), nullptr, good->alignment());
}

}  // namespace

TEST(Gemma3Test, HyperparametersAsLlamaCppReadsThem) {
  auto model = Model::load(open_model_file("synthetic:tiny-gemma3:F32"));
  const HParams& hp = model->hparams();
  EXPECT_EQ(model->arch().ffn, FfnKind::GeGLU);
  EXPECT_TRUE(model->tied_embeddings());
  EXPECT_EQ(hp.sliding_window, 8);
  for (int il = 0; il < hp.n_layer; ++il) EXPECT_EQ(hp.is_sliding(il), il != 5) << "layer " << il;
  EXPECT_FLOAT_EQ(hp.rope_base(0), 10000.0f);
  EXPECT_FLOAT_EQ(hp.rope_scale(0), 1.0f);
  EXPECT_FLOAT_EQ(hp.rope_base(5), 1000000.0f);
  EXPECT_FLOAT_EQ(hp.rope_scale(5), 0.125f);
  EXPECT_FLOAT_EQ(hp.attn_scale, 1.0f / 8.0f) << "1/sqrt(head_dim) below 62 layers";
  EXPECT_FLOAT_EQ(hp.embd_scale, 16.0f);
  EXPECT_EQ(hp.final_logit_softcap, 0.0f);

  // The pattern key: P = 3 makes every third layer global, 0 makes every layer slide, an array gives
  // the flags; no window: no sliding layer at all.
  auto good = open_model_file("synthetic:tiny-gemma3:F32");
  auto p3 = Model::load(edited(good, [](gguf::Metadata& md) { md.set("gemma3.attention.sliding_window_pattern", gguf::Value::u32(3)); }));
  for (int il = 0; il < 8; ++il) EXPECT_EQ(p3->hparams().is_sliding(il), il % 3 != 2) << il;
  auto p0 = Model::load(edited(good, [](gguf::Metadata& md) { md.set("gemma3.attention.sliding_window_pattern", gguf::Value::u32(0)); }));
  EXPECT_EQ(p0->hparams().count_sliding_layers(0, 8), 8);
  auto arr = Model::load(edited(good, [](gguf::Metadata& md) {
    md.set("gemma3.attention.sliding_window_pattern", gguf::Value::i32_array({1, 0, 1, 0, 1, 0, 1, 0}));
  }));
  for (int il = 0; il < 8; ++il) EXPECT_EQ(arr->hparams().is_sliding(il), il % 2 == 0) << il;
  auto none = Model::load(edited(good, [](gguf::Metadata& md) { md.erase("gemma3.attention.sliding_window"); }));
  EXPECT_FALSE(none->hparams().has_sliding_layers());
  EXPECT_FLOAT_EQ(none->hparams().rope_base(0), 1000000.0f);
  // A short pattern array is refused, naming the key.
  try {
    Model::load(edited(good, [](gguf::Metadata& md) {
      md.set("gemma3.attention.sliding_window_pattern", gguf::Value::i32_array({1, 0}));
    }));
    ADD_FAILURE() << "a short pattern array loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sliding_window_pattern"), std::string::npos) << e.what();
  }
}

// Gemma-3-27B: 62 layers (10 global: 5, 11, ..., 59), attention scale 1/sqrt(5376/32) = 1/sqrt(168),
// 808 tensors with tied embeddings; llama.cpp's Q4_K_M gives the tied token_embd Q6_K and attn_v /
// ffn_down Q6_K on the use_more_bits layers.
TEST(Gemma3Test, Gemma3_27bLayout) {
  const SyntheticLayout layout = synthetic_layout(parse_synthetic_spec("gemma3-27b:Q4_K_M"));
  const HParams hp = read_hparams(layout.metadata, *find_arch("gemma3"));
  EXPECT_EQ(hp.n_layer, 62);
  EXPECT_NEAR(hp.attn_scale, 1.0 / std::sqrt(168.0), 1e-7);
  EXPECT_EQ(hp.count_sliding_layers(0, 62), 52);
  for (int il = 5; il < 62; il += 6) EXPECT_FALSE(hp.is_sliding(il)) << il;
  EXPECT_EQ(hp.sliding_window, 1024);
  EXPECT_FLOAT_EQ(hp.rope_scale(5), 0.125f);
  EXPECT_FLOAT_EQ(hp.rope_base(4), 10000.0f);
  std::map<std::string, int> count_by_type;
  std::map<std::string, const gguf::TensorInfo*> by_name;
  for (const auto& t : layout.tensors) {
    by_name[t.name] = &t;
    const size_t dot = t.name.find('.', 4);
    const std::string base = t.name.rfind("blk.", 0) == 0 ? t.name.substr(dot + 1) : t.name;
    count_by_type[base + " " + dtype_name(t.type)]++;
  }
  EXPECT_EQ(layout.tensors.size(), 808u);
  EXPECT_EQ(by_name.count("output.weight"), 0u);
  EXPECT_EQ(by_name["token_embd.weight"]->type, DType::Q6_K);
  EXPECT_EQ(by_name["token_embd.weight"]->ne[1], 262208);
  EXPECT_EQ(by_name["blk.0.attn_q.weight"]->ne[1], 32 * 128);
  EXPECT_EQ(by_name["blk.0.attn_k.weight"]->ne[1], 16 * 128);
  EXPECT_EQ(by_name["blk.0.ffn_gate.weight"]->ne[1], 21504);
  EXPECT_EQ(count_by_type["post_attention_norm.weight F32"], 62);
  EXPECT_EQ(count_by_type["post_ffw_norm.weight F32"], 62);
  EXPECT_EQ(count_by_type["attn_q_norm.weight F32"], 62);
  // use_more_bits(i, 62): i < 7, i >= 54, or (i - 7) % 3 == 2: 7 + 8 + 15 layers.
  EXPECT_EQ(count_by_type["attn_v.weight Q6_K"], 30);
  EXPECT_EQ(count_by_type["ffn_down.weight Q6_K"], 30);
  EXPECT_EQ(count_by_type["attn_q.weight Q4_K"], 62);
}

// f32 weights and KV: every chunking, with 4-position blocks so the 8-position window starts inside
// a block and drops whole blocks, matches the reference to float rounding.
TEST(Gemma3Test, SlidingWindowMatchesReferenceInEveryChunking) {
  auto model = Model::load(open_model_file("synthetic:tiny-gemma3:F32"));
  const auto tokens = tokens_for(29, model->hparams().n_vocab);
  for (int n_batch : {1, 3, 8, 29}) {
    for (int block : {4, 32}) {
      EngineOptions o;
      o.type_k = o.type_v = DType::F32;
      o.n_batch = n_batch;
      o.kv_block_size = block;
      const double e = worst_nmse(model, o, tokens);
      EXPECT_LT(e, 1e-10) << "n_batch " << n_batch << " block " << block;
    }
  }
}

// The control: a reference without the window (the same weights, sliding_window removed) disagrees
// with the engine once the sequence is longer than the window, so the test above can fail.
TEST(Gemma3Test, TheWindowChangesTheLogits) {
  auto file = open_model_file("synthetic:tiny-gemma3:F32");
  // One RoPE for every layer (base 1e6, no scaling) so that only the window differs between the two.
  auto model = Model::load(edited(file, [](gguf::Metadata& md) {
    md.set("gemma3.rope.freq_base_swa", gguf::Value::f32(1000000.0f));
    md.erase("gemma3.rope.scaling.type");
    md.erase("gemma3.rope.scaling.factor");
  }));
  auto unwindowed = Model::load(edited(file, [](gguf::Metadata& md) {
    md.erase("gemma3.attention.sliding_window");
    md.erase("gemma3.rope.scaling.type");
    md.erase("gemma3.rope.scaling.factor");
  }));
  // Within the window the two agree; beyond it they do not.
  EngineOptions o;
  o.type_k = o.type_v = DType::F32;
  auto engine = Engine::create(model, o);
  const int seq = engine->memory().create_sequence();
  const auto tokens = tokens_for(16, model->hparams().n_vocab, 3);
  const auto logits = engine->eval(seq, tokens, true);
  test::ReferenceForward plain(*unwindowed);
  const int n_vocab = model->hparams().n_vocab;
  double inside = 0, outside = 0;
  for (int i = 0; i < 16; ++i) {
    const double e = nmse(logits.data() + (size_t)i * n_vocab, plain.step(tokens[(size_t)i]));
    (i < 8 ? inside : outside) = std::max(i < 8 ? inside : outside, e);
  }
  EXPECT_LT(inside, 1e-6);
  EXPECT_GT(outside, 1e-4);
}

TEST(Gemma3Test, QuantizedWeightsAndKvWithinBounds) {
  auto model = Model::load(open_model_file("synthetic:tiny-gemma3:Q4_K_M"));
  const auto tokens = tokens_for(20, model->hparams().n_vocab, 1);
  EngineOptions o;
  o.n_batch = 6;
  o.kv_block_size = 4;
  const double e = worst_nmse(model, o, tokens, DType::F16, DType::F16);
  std::printf("tiny-gemma3:Q4_K_M KV f16 NMSE %.3g\n", e);
  EXPECT_LT(e, 5e-3);  // measured 3.3e-3: the int8 activations of the quantized kernels
}

// A final logit softcap (llama.cpp reads gemma3.final_logit_softcapping; Gemma 3 checkpoints have none).
TEST(Gemma3Test, FinalLogitSoftcap) {
  auto file = open_model_file("synthetic:tiny-gemma3:F32");
  auto model = Model::load(edited(file, [](gguf::Metadata& md) { md.set("gemma3.final_logit_softcapping", gguf::Value::f32(0.05f)); }));
  EXPECT_FLOAT_EQ(model->hparams().final_logit_softcap, 0.05f);
  EngineOptions o;
  o.type_k = o.type_v = DType::F32;
  EXPECT_LT(worst_nmse(model, o, tokens_for(10, model->hparams().n_vocab, 2)), 1e-10);
}

// The sliding layers keep rings of window + n_batch - 1 positions (in whole blocks) per sequence instead of blocks, so
// the paged KV cache holds only the global layers: the report says so, and for gemma3-27b at -c 32768
// (f16 K and V) the numbers are what the window implies.
TEST(Gemma3Test, SlidingLayersMemoryIsBoundedByTheWindow) {
  auto model = Model::load(open_model_file("synthetic:tiny-gemma3:Q8_0"));
  EngineOptions o;
  o.n_ctx = 512;
  o.n_batch = 8;
  o.n_seq_max = 2;
  auto engine = Engine::create(model, o);
  std::string report;
  for (const auto& line : engine->report()) report += line + "\n";
  EXPECT_NE(report.find("(1 of 8 layers keep a KV cache)"), std::string::npos) << report;
  EXPECT_NE(report.find("sliding-window KV: 7 layers keep the last 8 positions (32 with a step's tokens)"), std::string::npos)
      << report;

  // gemma3-27b, layout only: 10 global layers x 32768 positions x 2 x 16 x 128 f16 = 2560 MiB; each of the
  // 52 sliding layers keeps 1024 + 512 - 1 positions, 1536 in blocks of 32, per sequence (624 MiB in all).
  const SyntheticLayout layout = synthetic_layout(parse_synthetic_spec("gemma3-27b:Q4_K_M"));
  auto file = gguf::GgufFile::from_parts("gemma3-27b.gguf", layout.metadata, layout.tensors, nullptr, 32);
  auto big = Model::load(file);
  cpu::CpuBackend cpu(1);
  KvConfig kv;
  kv.block_size = 32;
  kv.n_blocks = 32768 / 32;
  kv.swa_ring = 1536;
  const LayerSet all{0, 62, true, true};
  EXPECT_EQ(cpu.kv_block_bytes(*big, all, kv) * kv.n_blocks, 10ull * 32768 * 2 * 16 * 128 * 2);
  EXPECT_EQ(cpu.swa_cell_bytes(*big, all, kv), 52ull * 1536 * 2 * 16 * 128 * 2);
  kv.swa_ring = 0;  // without rings every layer is paged
  EXPECT_EQ(cpu.kv_block_bytes(*big, all, kv) * kv.n_blocks, 62ull * 32768 * 2 * 16 * 128 * 2);
}

// The memory bill (`roofline plan`'s, on the host) of a tiny gemma3 at serve's settings is what the engine
// sets up and what the CPU backend allocates: the global layer's blocks for the whole context, one ring per
// slot for each sliding layer, and the window snapshots serve keeps (two per slot within --cache-ram).
TEST(Gemma3Test, MemoryBillIsWhatTheCpuBackendAllocates) {
  auto model = Model::load(open_model_file("synthetic:tiny-gemma3:Q8_0"));
  PlanSettings ps;
  ps.n_ctx = 1024;
  ps.n_parallel = 4;
  ps.n_batch = 16;
  ps.kv_block_size = 16;
  ps.n_gpu_layers = 0;
  const Plan plan = make_plan(*model, *find_gpu_spec("cpu"), ps);
  const double row = 2.0 * (2 * 64) * 2;  // K and V rows of 2 heads x 64, f16
  EXPECT_EQ(plan.kv.swa_ring, 32) << "window 8 + a step's 16 - 1, in blocks of 16";
  EXPECT_EQ(plan.kv.swa_snapshot_blocks, 1) << "the 7 positions before a boundary, in a block";
  EXPECT_DOUBLE_EQ(plan.host_bill.kv, 1 * 1024 * row) << "the one global layer, the whole context";
  EXPECT_DOUBLE_EQ(plan.host_bill.swa, 7 * 32 * row * 4) << "7 sliding layers, a ring per slot";
  EXPECT_EQ(plan.window_snapshots, 8);
  EXPECT_DOUBLE_EQ(plan.host_bill.snapshots, 8 * 7 * 16 * row);
  EXPECT_DOUBLE_EQ(plan.kv_bytes_total, plan.host_bill.kv + plan.host_bill.swa);

  // The engine as serve creates it.
  EngineOptions o;
  o.n_ctx = ps.n_ctx;
  o.n_batch = ps.n_batch;
  o.kv_block_size = ps.kv_block_size;
  o.n_seq_max = ps.n_parallel;
  o.n_state_snapshots = window_snapshot_count(*model, plan.kv, ps.n_parallel, ps.cache_ram_mib);
  EXPECT_EQ(o.n_state_snapshots, plan.window_snapshots);
  auto engine = Engine::create(model, o);
  const KvConfig& kv = engine->kv_config();
  EXPECT_EQ(kv.n_blocks, plan.kv.n_blocks);
  EXPECT_EQ(kv.swa_ring, plan.kv.swa_ring);
  EXPECT_EQ(kv.swa_snapshot_blocks, plan.kv.swa_snapshot_blocks);
  EXPECT_EQ(SequenceMemory::state_cells({kv.n_blocks, kv.block_size, true, o.n_seq_max, o.n_state_snapshots, true, kv.swa_ring, 8}),
            ps.n_parallel) << "the snapshots take no state cells";
  std::string report;
  for (const auto& line : engine->report()) report += line + "\n";
  EXPECT_NE(report.find("prompt-cache snapshots of the sliding layers: 8 x "), std::string::npos) << report;
  EXPECT_NE(report.find("(the 16 positions before a block boundary) in host memory"), std::string::npos) << report;
  // What a CPU backend holding every layer allocates with that geometry, as the engine initializes it.
  cpu::CpuBackend cpu(1);
  cpu.load(model, LayerSet{0, model->hparams().n_layer, true, true});
  cpu.init_kv(kv);
  cpu.init_state(ps.n_parallel);
  cpu.init_snapshots(o.n_state_snapshots);
  EXPECT_EQ((double)cpu.kv_bytes_allocated(), plan.host_bill.kv + plan.host_bill.swa + plan.host_bill.snapshots);
  EXPECT_EQ(cpu.swa_snapshot_bytes(*model, LayerSet{0, model->hparams().n_layer, true, true}, kv), window_snapshot_bytes(*model, kv));
  // No room in --cache-ram: no snapshots (and no reuse), never a partial one.
  EXPECT_EQ(window_snapshot_count(*model, plan.kv, 4, 0), 0);
  EXPECT_EQ(window_snapshot_count(*model, plan.kv, 4, 3 * 7 * 16 * row / 1048576.0), 3);
  EXPECT_EQ(window_snapshot_count(*model, plan.kv, 4, -1), 8);
}

// Rings that wrap many times (n_batch 4, blocks of 4: 12 positions for a window of 8), a fork that copies them, and
// prompt caching that resumes from a window snapshot: the same logits as fresh evaluations.
TEST(Gemma3Test, ForksAndPrefixReuseKeepTheWindow) {
  auto model = Model::load(open_model_file("synthetic:tiny-gemma3:Q8_0"));
  const int n_vocab = model->hparams().n_vocab;
  EngineOptions o;
  o.kv_block_size = 4;
  o.n_batch = 4;
  o.n_seq_max = 3;
  o.n_state_snapshots = 2;
  EXPECT_LT(worst_nmse(model, o, tokens_for(60, n_vocab, 4), DType::F16, DType::F16), 2e-3);
  auto engine = Engine::create(model, o);
  SequenceMemory& mem = engine->memory();
  ASSERT_TRUE(mem.recurrent()) << "rings cannot be cut back: sequences take state cells";
  ASSERT_TRUE(mem.windowed()) << "no recurrent layers: snapshots of the window, not of state cells";
  const auto prompt = tokens_for(22, n_vocab, 5);
  const int s = mem.create_sequence();
  const std::vector<int32_t> first(prompt.begin(), prompt.begin() + 16), rest(prompt.begin() + 16, prompt.end());
  engine->eval(s, first, false);
  engine->eval(s, rest, false);  // in chunks of 4: 20, 22
  // Prompt caching: a window snapshot at the last block boundary (20), taken while the ring still holds
  // positions 13..19; none during the steps themselves.
  EXPECT_EQ(mem.n_state_snapshots(), 0);
  mem.cache_blocks(s, prompt);
  EXPECT_EQ(mem.n_state_snapshots(), 1);
  // A fork continues with the rings as they are.
  const int f = engine->fork_sequence(s);
  const auto tail_a = tokens_for(9, n_vocab, 6), tail_b = tokens_for(7, n_vocab, 7);
  const auto la = engine->eval(s, tail_a, true);
  const auto lb = engine->eval(f, tail_b, true);
  auto fresh = Engine::create(model, o);
  auto full = [&](const std::vector<int32_t>& tail) {
    std::vector<int32_t> t = prompt;
    t.insert(t.end(), tail.begin(), tail.end());
    const int q = fresh->memory().create_sequence();
    auto l = fresh->eval(q, t, true);
    fresh->memory().free_sequence(q);
    return std::vector<float>(l.begin() + prompt.size() * (size_t)n_vocab, l.end());
  };
  EXPECT_EQ(0, std::memcmp(la.data(), full(tail_a).data(), la.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(lb.data(), full(tail_b).data(), lb.size() * sizeof(float)));
  // The ring of s has moved on (31 positions): a snapshot at 28 would need 21..27, still there; one at
  // 20 no longer (13..19 were overwritten), so caching s's blocks again adds the one at 28 only.
  std::vector<int32_t> s_tokens = prompt;
  s_tokens.insert(s_tokens.end(), tail_a.begin(), tail_a.end());
  mem.cache_blocks(s, s_tokens);
  EXPECT_EQ(mem.n_state_snapshots(), 2);
  mem.free_sequence(f);
  mem.free_sequence(s);
  // Reuse: the longest prefix ending at a snapshot, never beyond it.
  auto longer = prompt;
  const auto more = tokens_for(6, n_vocab, 8);
  longer.insert(longer.end(), more.begin(), more.end());
  EXPECT_EQ(mem.kv().match_prefix(longer, 100), 5);
  EXPECT_EQ(mem.match_prefix(longer, 100), 5);
  const int t = mem.create_sequence();
  ASSERT_EQ(mem.adopt_prefix(t, longer, 100), 20);
  const auto got = engine->eval(t, std::vector<int32_t>(longer.begin() + 20, longer.end()), true);
  const int q = fresh->memory().create_sequence();
  const auto want = fresh->eval(q, longer, true);
  EXPECT_EQ(0, std::memcmp(got.data(), want.data() + 20 * (size_t)n_vocab, got.size() * sizeof(float)));
  mem.free_sequence(t);
  // The continuation of s from its snapshot at 28 (a ring restored into another cell, wrapped differently).
  auto s_more = s_tokens;
  s_more.push_back(3);
  const int u = mem.create_sequence();
  ASSERT_EQ(mem.adopt_prefix(u, s_more, 100), 28);
  const auto got_s = engine->eval(u, std::vector<int32_t>(s_more.begin() + 28, s_more.end()), true);
  const int q2 = fresh->memory().create_sequence();
  const auto want_s = fresh->eval(q2, s_more, true);
  EXPECT_EQ(0, std::memcmp(got_s.data(), want_s.data() + 28 * (size_t)n_vocab, got_s.size() * sizeof(float)));
}

// A snapshot is never taken from a ring that no longer holds the window before the boundary: with the
// ring full of later positions the prefix is simply not reused.
TEST(Gemma3Test, NoSnapshotFromARingThatMovedOn) {
  auto model = Model::load(open_model_file("synthetic:tiny-gemma3:Q8_0"));
  const int n_vocab = model->hparams().n_vocab;
  EngineOptions o;
  o.kv_block_size = 4;
  o.n_batch = 4;
  o.n_seq_max = 1;
  o.n_state_snapshots = 4;
  auto engine = Engine::create(model, o);
  SequenceMemory& mem = engine->memory();
  const auto tokens = tokens_for(40, n_vocab, 9);
  const int s = mem.create_sequence();
  engine->eval(s, tokens, false);
  mem.cache_blocks(s, std::span<const int32_t>(tokens.data(), 20));  // the window before 20 was overwritten long ago
  EXPECT_EQ(mem.n_state_snapshots(), 0);
  EXPECT_EQ(mem.match_prefix(tokens, 100), 0);
  mem.cache_blocks(s, tokens);  // at 40: 33..39 are in the ring of 12
  EXPECT_EQ(mem.n_state_snapshots(), 1);
  EXPECT_EQ(mem.match_prefix(tokens, 100), 10);
  EXPECT_EQ(mem.match_prefix(tokens, 9), 0) << "a shorter prefix has no snapshot of its own";
}

// The roofline counts what a decode token reads: the global layer its whole depth, the sliding layers
// at most their window.
TEST(Gemma3Test, RooflineReadsTheWindowOfSlidingLayers) {
  auto model = Model::load(open_model_file("synthetic:tiny-gemma3:Q8_0"));
  const HParams& hp = model->hparams();
  EXPECT_EQ(kv_positions_read(hp, 0, 100), 8);
  EXPECT_EQ(kv_positions_read(hp, 5, 100), 100);
  EXPECT_EQ(kv_positions_read(hp, 0, 3), 3);
  const double row = 2.0 * 2 * 64 * 2;  // K and V rows of 2 heads x 64, f16
  EXPECT_DOUBLE_EQ(decode_bytes_per_token(*model, 200, DType::F16, DType::F16) - decode_bytes_per_token(*model, 100, DType::F16, DType::F16),
                   100 * row) << "only the global layer reads further";
  EXPECT_DOUBLE_EQ(decode_bytes_per_token(*model, 8, DType::F16, DType::F16) - decode_bytes_per_token(*model, 4, DType::F16, DType::F16),
                   8 * 4 * row) << "within the window every layer does";
}
