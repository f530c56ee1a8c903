// Mixture-of-experts pieces: the CPU's routing (softmax, top-k, renormalised weights) against a plain
// double-precision routing on random logits of odd sizes; the grouped expert products against a
// per-row double reference on random stacked tensors (f32 and quantized), and batch independence;
// loading llama.cpp-style qwen3moe / qwen35moe files (the shared-expert gate as [n_embd] or [n_embd, 1],
// clear errors for missing keys and mis-shaped experts); llama.cpp's Q4_K_M mix on the real MoE shapes;
// which layers --cpu-moe / --n-cpu-moe / -ot keep in host memory; importance matrices per expert.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <cstring>
#include <functional>
#include <random>

#include "backend/cpu/host_experts.h"
#include "backend/cpu/moe_cpu.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/imatrix.h"
#include "model/quantize.h"
#include "formats/quant_ref.h"
#include "model/model.h"
#include "model/quant_mix.h"
#include "model/synthetic.h"
#include "test_util.h"

using namespace roofline;

namespace {

// Plain routing in double: softmax, indices sorted by probability (stable: lower index first on ties).
void route_ref(const std::vector<float>& logits, int k, bool normalize, double scale, std::vector<int>& ids,
               std::vector<double>& w) {
  const double mx = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double sum = 0;
  for (size_t e = 0; e < p.size(); ++e) sum += p[e] = std::exp((double)logits[e] - mx);
  std::vector<int> order(p.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[(size_t)a] > p[(size_t)b]; });
  ids.assign(order.begin(), order.begin() + k);
  double top = 0;
  for (int e : ids) top += p[(size_t)e];
  w.clear();
  for (int e : ids) w.push_back(p[(size_t)e] / (normalize ? top : sum) * scale);
}

std::vector<float> random_floats(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

}  // namespace

TEST(MoeTest, RoutingMatchesPlainSoftmaxTopK) {
  struct Case {
    int n_expert, k;
    bool normalize;
    float scale;
  };
  for (const Case c : {Case{7, 2, true, 1.0f}, Case{37, 5, false, 1.0f}, Case{128, 8, true, 1.0f}, Case{256, 8, true, 2.5f},
                       Case{3, 3, true, 1.0f}, Case{5, 1, false, 1.0f}}) {
    for (uint32_t seed = 1; seed <= 20; ++seed) {
      const std::vector<float> logits = random_floats((size_t)c.n_expert, seed * 7 + (uint32_t)c.n_expert, 2.0f);
      std::vector<int32_t> ids((size_t)c.k);
      std::vector<float> w((size_t)c.k);
      cpu::route_row(logits.data(), c.n_expert, c.k, c.normalize, c.scale, ids.data(), w.data());
      std::vector<int> want_ids;
      std::vector<double> want_w;
      route_ref(logits, c.k, c.normalize, c.scale, want_ids, want_w);
      double sum = 0;
      for (int i = 0; i < c.k; ++i) {
        EXPECT_EQ(ids[(size_t)i], want_ids[(size_t)i]) << c.n_expert << " experts, seed " << seed << ", pick " << i;
        EXPECT_NEAR(w[(size_t)i], want_w[(size_t)i], 1e-6 * c.scale);
        sum += w[(size_t)i];
      }
      if (c.normalize) {
        EXPECT_NEAR(sum, c.scale, 1e-5 * c.scale);
      } else {
        EXPECT_LT(sum, 1.0 + 1e-6);
      }
    }
  }
  // Ties: the lower index first; all-equal logits give weights 1/k after renormalisation.
  const std::vector<float> tied = {0.5f, 1.0f, 1.0f, 0.5f, 1.0f};
  int32_t ids[3];
  float w[3];
  cpu::route_row(tied.data(), 5, 3, true, 1.0f, ids, w);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 2);
  EXPECT_EQ(ids[2], 4);
  for (float x : w) EXPECT_NEAR(x, 1.0f / 3, 1e-7);
}

TEST(MoeTest, GroupedExpertProductsMatchAPerRowReference) {
  struct Case {
    DType type;
    int n_embd, n_ff, n_expert, k, n_rows;
    double bound;
  };
  // f32: float rounding; Q8_0 / Q4_K: both products quantize their activations to 8 bits (measured
  // 1.35e-4 and 3.06e-4; bounds about 3x).
  for (const Case c : {Case{DType::F32, 96, 40, 7, 2, 13, 1e-10}, Case{DType::Q8_0, 96, 64, 9, 3, 29, 4e-4},
                       Case{DType::Q4_K, 256, 256, 6, 2, 64, 1e-3}, Case{DType::F16, 64, 33, 5, 5, 3, 1e-6}}) {
    SCOPED_TRACE(dtype_name(c.type));
    HParams hp;
    hp.n_embd = c.n_embd;
    hp.n_expert = c.n_expert;
    hp.n_expert_used = c.k;
    hp.n_ff_exp = c.n_ff;
    // Stacked tensors in `type`, and their dequantized values (what the reference multiplies).
    auto stacked = [&](const char* name, int64_t in, int64_t out, uint32_t seed, std::vector<uint8_t>& bytes,
                       std::vector<float>& values) {
      gguf::TensorInfo t;
      t.name = name;
      t.type = c.type;
      t.n_dims = 3;
      t.ne = {in, out, c.n_expert, 1};
      t.n_bytes = gguf::tensor_bytes(t.type, t.ne);
      const std::vector<float> src = random_floats((size_t)(in * out * c.n_expert), seed, 0.1f);
      bytes.resize(t.n_bytes);
      quantize_rows_ref(t.type, src.data(), bytes.data(), out * c.n_expert, in);
      values.resize(src.size());
      dequantize_rows_ref(t.type, bytes.data(), values.data(), out * c.n_expert, in);
      t.data = bytes.data();
      return t;
    };
    std::vector<uint8_t> bg, bu, bd, br;
    std::vector<float> vg, vu, vd, vr;
    const gguf::TensorInfo tg = stacked("g", c.n_embd, c.n_ff, 1, bg, vg), tu = stacked("u", c.n_embd, c.n_ff, 2, bu, vu),
                           td = stacked("d", c.n_ff, c.n_embd, 3, bd, vd);
    gguf::TensorInfo tr;  // the router, f32 as llama.cpp's converter writes it
    tr.name = "r";
    tr.type = DType::F32;
    tr.n_dims = 2;
    tr.ne = {c.n_embd, c.n_expert, 1, 1};
    tr.n_bytes = (size_t)c.n_embd * c.n_expert * 4;
    vr = random_floats((size_t)c.n_embd * c.n_expert, 4, 0.3f);
    tr.data = reinterpret_cast<const uint8_t*>(vr.data());
    cpu::ExpertViews views;
    views.build(Weight{&tg}, Weight{&tu}, Weight{&td});
    ThreadPool pool(2);
    const std::vector<float> x = random_floats((size_t)c.n_rows * c.n_embd, 5, 1.0f);
    std::vector<float> out((size_t)c.n_rows * c.n_embd);
    cpu::MoeExperts moe;
    moe.forward(Weight{&tr}, views, hp, x.data(), c.n_rows, out.data(), pool);

    double num = 0, den = 0;
    for (int r = 0; r < c.n_rows; ++r) {
      const float* xr = x.data() + (size_t)r * c.n_embd;
      std::vector<float> logits((size_t)c.n_expert);
      for (int e = 0; e < c.n_expert; ++e) {
        double s = 0;
        for (int i = 0; i < c.n_embd; ++i) s += (double)vr[(size_t)e * c.n_embd + i] * xr[i];
        logits[(size_t)e] = (float)s;
      }
      std::vector<int> ids;
      std::vector<double> w;
      route_ref(logits, c.k, true, 1.0, ids, w);
      for (int i = 0; i < c.k; ++i) EXPECT_EQ(moe.ids()[(size_t)r * c.k + i], ids[(size_t)i]) << "row " << r;
      std::vector<double> want((size_t)c.n_embd, 0.0);
      for (int i = 0; i < c.k; ++i) {
        const size_t e = (size_t)ids[(size_t)i];
        std::vector<double> h((size_t)c.n_ff);
        for (int j = 0; j < c.n_ff; ++j) {
          double g = 0, u = 0;
          for (int q = 0; q < c.n_embd; ++q) {
            g += (double)vg[(e * c.n_ff + j) * c.n_embd + q] * xr[q];
            u += (double)vu[(e * c.n_ff + j) * c.n_embd + q] * xr[q];
          }
          h[(size_t)j] = g / (1 + std::exp(-g)) * u;
        }
        for (int o = 0; o < c.n_embd; ++o) {
          double y = 0;
          for (int j = 0; j < c.n_ff; ++j) y += (double)vd[(e * c.n_embd + o) * c.n_ff + j] * h[(size_t)j];
          want[(size_t)o] += w[(size_t)i] * y;
        }
      }
      for (int o = 0; o < c.n_embd; ++o) {
        const double d = out[(size_t)r * c.n_embd + o] - want[(size_t)o];
        num += d * d;
        den += want[(size_t)o] * want[(size_t)o];
      }
    }
    EXPECT_LT(num / den, c.bound);

    // A row's output does not depend on the rest of the batch (bit for bit): the last row alone.
    std::vector<float> alone((size_t)c.n_embd);
    moe.forward(Weight{&tr}, views, hp, x.data() + (size_t)(c.n_rows - 1) * c.n_embd, 1, alone.data(), pool);
    EXPECT_EQ(0, std::memcmp(alone.data(), out.data() + (size_t)(c.n_rows - 1) * c.n_embd, alone.size() * 4));
    // What the profile counts: the router and the k experts the row chose, each once.
    const double expert_bytes = (double)(tg.n_bytes + tu.n_bytes + td.n_bytes) / c.n_expert;
    EXPECT_DOUBLE_EQ(moe.weight_bytes_read(), (double)tr.n_bytes + c.k * expert_bytes);

    // The same through packed copies of the experts (the types with packed kernels on this CPU): as close to
    // the reference, and the last row alone gives the same bits.
    cpu::PackedWeights packed;
    bool any = false;
    for (const auto* v : {&views.gate, &views.up, &views.down})
      for (const gguf::TensorInfo& t : *v) any = packed.add(Weight{&t}, pool) || any;
    if (!any) continue;
    std::vector<float> out_p((size_t)c.n_rows * c.n_embd), alone_p((size_t)c.n_embd);
    moe.forward(Weight{&tr}, views, hp, x.data(), c.n_rows, out_p.data(), pool, nullptr, &packed);
    double num_p = 0;
    for (size_t i = 0; i < out.size(); ++i) num_p += ((double)out_p[i] - out[i]) * ((double)out_p[i] - out[i]);
    EXPECT_LT(num_p / den, c.bound) << "packed experts against the experts read in place";
    moe.forward(Weight{&tr}, views, hp, x.data() + (size_t)(c.n_rows - 1) * c.n_embd, 1, alone_p.data(), pool, nullptr,
                &packed);
    EXPECT_EQ(0, std::memcmp(alone_p.data(), out_p.data() + (size_t)(c.n_rows - 1) * c.n_embd, alone_p.size() * 4));
  }
}

// Host-memory experts (--cpu-moe for a GPU backend) on a synthetic Q4_K_M MoE model: the same routed output
// as the CPU's MoE over the layer's experts read in place, and each row alone gives the same bits.
TEST(MoeTest, HostExpertsMatchTheExpertsReadInPlace) {
  auto m = Model::load(build_synthetic_model(parse_synthetic_spec("synthetic:tiny-qwen3moe:Q4_K_M")));
  const HParams& hp = m->hparams();
  HostExperts host(m, std::vector<bool>((size_t)hp.n_layer, true), 2);
  ThreadPool pool(2);
  const int n = 5;
  const std::vector<float> x = random_floats((size_t)n * hp.n_embd, 9, 1.0f);
  for (int il = 0; il < hp.n_layer; ++il) {
    const LayerWeights& L = m->layer(il);
    cpu::ExpertViews views;
    views.build(L[LayerTensor::FfnGateExps], L[LayerTensor::FfnUpExps], L[LayerTensor::FfnDownExps]);
    cpu::MoeExperts moe;
    std::vector<float> want((size_t)n * hp.n_embd), got((size_t)n * hp.n_embd), alone((size_t)hp.n_embd);
    moe.forward(L[LayerTensor::FfnGateInp], views, hp, x.data(), n, want.data(), pool);
    host.forward(il, x.data(), n, got.data());
    double num = 0, den = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      num += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
      den += (double)want[i] * want[i];
    }
    std::printf("  layer %d: NMSE %.3g\n", il, num / den);
    EXPECT_LT(num / den, 1e-6) << "layer " << il;  // float order of the packed kernels, 8-bit hidden rows
    for (int r = 0; r < n; ++r) {
      host.forward(il, x.data() + (size_t)r * hp.n_embd, 1, alone.data());
      EXPECT_EQ(0, std::memcmp(alone.data(), got.data() + (size_t)r * hp.n_embd, alone.size() * 4)) << "layer " << il << " row " << r;
    }
  }
}

TEST(MoeTest, ExpertSliceIsOneMatrixOfTheStack) {
  gguf::TensorInfo t;
  t.name = "blk.0.ffn_down_exps.weight";
  t.type = DType::Q8_0;
  t.n_dims = 3;
  t.ne = {64, 10, 4, 1};
  t.n_bytes = gguf::tensor_bytes(t.type, t.ne);
  std::vector<uint8_t> bytes(t.n_bytes);
  t.data = bytes.data();
  for (int e = 0; e < 4; ++e) {
    const gguf::TensorInfo s = cpu::expert_slice(t, e);
    EXPECT_EQ(s.n_dims, 2);
    EXPECT_EQ(s.ne[0], 64);
    EXPECT_EQ(s.ne[1], 10);
    EXPECT_EQ(s.ne[2], 1);
    EXPECT_EQ(s.n_bytes, t.n_bytes / 4);
    EXPECT_EQ(s.data, bytes.data() + e * s.n_bytes);
  }
}

namespace {

gguf::Metadata tiny_moe_metadata(const std::string& shape) {
  SyntheticSpec spec = parse_synthetic_spec("synthetic:" + shape + ":F32");
  return synthetic_layout(spec).metadata;
}

// A synthetic model with its metadata or tensors edited before binding.
std::shared_ptr<const Model> load_edited(const std::string& shape, const std::function<void(gguf::Metadata&)>& edit_md,
                                         const std::function<void(std::vector<gguf::TensorInfo>&)>& edit_tensors) {
  SyntheticSpec spec = parse_synthetic_spec("synthetic:" + shape + ":F32");
  SyntheticLayout layout = synthetic_layout(spec);
  edit_md(layout.metadata);
  edit_tensors(layout.tensors);
  for (auto& t : layout.tensors) t.n_bytes = gguf::tensor_bytes(t.type, t.ne);
  auto file = gguf::GgufFile::from_parts("edited", std::move(layout.metadata), std::move(layout.tensors), nullptr, 32);
  return Model::load(file);
}

}  // namespace

TEST(MoeTest, LoadsLlamaCppLayoutsAndRefusesBrokenOnes) {
  // The synthetic layout is llama.cpp's: metadata keys and the shared-expert gate as [n_embd, 1].
  const gguf::Metadata md = tiny_moe_metadata("tiny-qwen35moe");
  EXPECT_EQ(md.get_int("qwen35moe.expert_count"), 6);
  EXPECT_EQ(md.get_int("qwen35moe.expert_used_count"), 2);
  EXPECT_EQ(md.get_int("qwen35moe.expert_feed_forward_length"), 256);
  EXPECT_EQ(md.get_int("qwen35moe.expert_shared_feed_forward_length"), 256);
  auto none = [](auto&) {};
  auto m = load_edited("tiny-qwen35moe", none, none);
  const HParams& hp = m->hparams();
  EXPECT_EQ(hp.n_expert, 6);
  EXPECT_EQ(hp.n_ff_shexp, 256);
  EXPECT_TRUE(hp.expert_weights_norm);
  const Weight& gate = m->layer(0)[LayerTensor::FfnGateInpShexp];
  ASSERT_TRUE(gate);
  EXPECT_EQ(gate.tensor->n_dims, 2);
  EXPECT_EQ(m->layer(1)[LayerTensor::FfnDownExps].tensor->ne[2], 6);
  EXPECT_FALSE(m->layer(0)[LayerTensor::FfnGate]);

  // The gate as a plain vector [n_embd] loads too.
  auto as_vector = [](std::vector<gguf::TensorInfo>& ts) {
    for (auto& t : ts)
      if (t.name.find("ffn_gate_inp_shexp") != std::string::npos) t.n_dims = 1;
  };
  EXPECT_NO_THROW(load_edited("tiny-qwen35moe", none, as_vector));

  // Without expert_feed_forward_length, llama.cpp's default n_ff / n_expert_used applies.
  auto no_ff_exp = [](gguf::Metadata& md) { md.erase("qwen3moe.expert_feed_forward_length"); };
  try {
    load_edited("tiny-qwen3moe", no_ff_exp, none);
    FAIL() << "expected a shape error (768 / 2 = 384 is not the experts' 256)";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ffn_gate_exps.weight has shape [256, 256, 6], expected [256, 384, 6]"),
              std::string::npos)
        << e.what();
  }
  auto no_count = [](gguf::Metadata& md) { md.erase("qwen3moe.expert_count"); };
  try {
    load_edited("tiny-qwen3moe", no_count, none);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("qwen3moe.expert_count' is missing"), std::string::npos) << e.what();
  }
  auto too_many_used = [](gguf::Metadata& md) { md.set("qwen3moe.expert_used_count", gguf::Value::u32(7)); };
  try {
    load_edited("tiny-qwen3moe", too_many_used, none);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expert_used_count = 7 is out of range [1, 6]"), std::string::npos) << e.what();
  }
  auto fewer_experts = [](std::vector<gguf::TensorInfo>& ts) {
    for (auto& t : ts)
      if (t.name == "blk.1.ffn_up_exps.weight") t.ne[2] = 5;
  };
  try {
    load_edited("tiny-qwen3moe", none, fewer_experts);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("blk.1.ffn_up_exps.weight has shape [256, 256, 5], expected [256, 256, 6]"),
              std::string::npos)
        << e.what();
  }
}

// llama.cpp's Q4_K_M on the real MoE shapes: experts' ffn_down by layer (use_more_bits over the block
// count), gate/up experts at the default, routers and the shared-expert gate kept f32, attn_v-like
// tensors by their counter.
TEST(MoeTest, Q4KMixOfTheRealShapes) {
  auto more_bits = [](int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; };
  for (const char* shape : {"qwen3-30b-a3b", "qwen3.5-35b-a3b"}) {
    SCOPED_TRACE(shape);
    const SyntheticLayout layout = synthetic_layout(parse_synthetic_spec(std::string("synthetic:") + shape + ":Q4_K_M"));
    const int n_layer = (int)layout.metadata.get_int(layout.metadata.get_string("general.architecture") + ".block_count");
    int n_exps = 0, i_wv = 0, n_wv = 0;
    for (const auto& t : layout.tensors) n_wv += t.name.find("attn_v.weight") != std::string::npos || t.name.find("attn_qkv.weight") != std::string::npos;
    for (const auto& t : layout.tensors) {
      int il = -1;
      std::sscanf(t.name.c_str(), "blk.%d.", &il);
      const std::string& n = t.name;
      if (n.find("ffn_down_exps") != std::string::npos || n.find("ffn_down_shexp") != std::string::npos) {
        EXPECT_EQ(t.type, more_bits(il, n_layer) ? DType::Q6_K : DType::Q4_K) << n;
        n_exps += n.find("_exps") != std::string::npos;
      } else if (n.find("ffn_gate_exps") != std::string::npos || n.find("ffn_up_exps") != std::string::npos ||
                 n.find("ffn_gate_shexp") != std::string::npos || n.find("ffn_up_shexp") != std::string::npos) {
        EXPECT_EQ(t.type, DType::Q4_K) << n;
      } else if (n.find("ffn_gate_inp") != std::string::npos) {
        EXPECT_EQ(t.type, DType::F32) << n;
      } else if (n.find("attn_v.weight") != std::string::npos || n.find("attn_qkv.weight") != std::string::npos) {
        EXPECT_EQ(t.type, more_bits(i_wv++, n_wv) ? DType::Q6_K : DType::Q4_K) << n;
      } else if (n == "output.weight") {
        EXPECT_EQ(t.type, DType::Q6_K);
      }
      if (n.find("_exps") != std::string::npos) {
        EXPECT_EQ(t.n_dims, 3) << n;
      }
      if (n.find("ffn_gate_inp_shexp") != std::string::npos) {
        EXPECT_EQ(t.n_dims, 2) << n;
        EXPECT_EQ(t.ne[1], 1) << n;
      }
    }
    EXPECT_EQ(n_exps, n_layer);
  }
  // The 3-D experts' bytes: a Q4_K_M qwen3-30b-a3b is ~17.3 GiB in llama.cpp's listings (17.7 GB).
  const SyntheticLayout l = synthetic_layout(parse_synthetic_spec("synthetic:qwen3-30b-a3b:Q4_K_M"));
  uint64_t bytes = 0;
  for (const auto& t : l.tensors) bytes += t.n_bytes;
  EXPECT_GT(bytes, 17.0e9);
  EXPECT_LT(bytes, 19.0e9);
}

// Which layers keep their experts in host memory (--cpu-moe, --n-cpu-moe, -ot REGEX=CPU): the first N,
// all, or those a pattern names; patterns that reach other tensors, and bad regexes, are refused.
TEST(MoeTest, ExpertPlacementFlagsPickLayers) {
  auto m = Model::load(build_synthetic_model(parse_synthetic_spec("synthetic:tiny-qwen35moe:F32")));
  auto count = [](const std::vector<bool>& v) { return (int)std::count(v.begin(), v.end(), true); };
  EXPECT_EQ(count(experts_on_host(*m, 0, {})), 0);
  EXPECT_EQ(experts_on_host(*m, 1, {}), (std::vector<bool>{true, false, false, false}));
  EXPECT_EQ(count(experts_on_host(*m, EngineOptions::kAllLayers, {})), 4);
  std::string note;
  EXPECT_EQ(experts_on_host(*m, 0, {"blk\\.[23]\\.ffn_.*_exps"}, &note), (std::vector<bool>{false, false, true, true}));
  EXPECT_TRUE(note.empty()) << note;
  EXPECT_EQ(experts_on_host(*m, 1, {"blk\\.3\\.ffn_down_exps"}, &note), (std::vector<bool>{true, false, false, true}));
  EXPECT_NE(note.find("layer 3: -ot matches 1 of its 3 expert tensors"), std::string::npos) << note;
  EXPECT_EQ(count(experts_on_host(*m, 0, {"exps"})), 4);  // llama.cpp's usual -ot exps=CPU
  auto refused = [&](const std::string& pattern, const std::string& part) {
    try {
      experts_on_host(*m, 0, {pattern});
      ADD_FAILURE() << pattern;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  refused("ffn_.*shexp", "is not a stacked expert tensor: only experts (ffn_*_exps) can be kept in host memory");
  refused("blk\\.0\\.", "matches blk.0.");
  refused("exps[", "not a valid regular expression");
  // A dense model: nothing to place, and experts-only patterns match nothing.
  auto dense = Model::load(build_synthetic_model(parse_synthetic_spec("synthetic:tiny-qwen3:F32")));
  EXPECT_EQ(count(experts_on_host(*dense, EngineOptions::kAllLayers, {"exps"})), 0);

  // The command line: -cmoe / -ncmoe / -ot spellings, =CPU only.
  auto r = test::run_cli({"run", "-m", "synthetic:tiny-qwen3moe:F32", "-p", "hi", "-n", "2", "-ot", "blk.0.ffn_gate=CPU"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("-ot 'blk.0.ffn_gate=CPU' matches blk.0.ffn_gate_inp.weight, which is not a stacked expert tensor"),
            std::string::npos) << r.err;
  r = test::run_cli({"run", "-m", "synthetic:tiny-qwen3moe:F32", "-p", "hi", "-n", "2", "-ot", "exps=CUDA0"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("only CPU is supported as the buffer type"), std::string::npos) << r.err;
  r = test::run_cli({"run", "-m", "synthetic:tiny-qwen3moe:F32", "-p", "hi", "-n", "2", "-ncmoe", "-3"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--n-cpu-moe -3"), std::string::npos) << r.err;
  r = test::run_cli({"run", "-m", "synthetic:tiny-qwen3moe:F32", "-p", "hi", "-n", "2", "-cmoe", "-ncmoe", "1", "-ot",
                     "blk\\.1\\.ffn_up_exps=cpu,blk\\.0\\.ffn_down_exps=CPU"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// Importance matrices of MoE models, as llama-imatrix keeps them: per expert of a stacked tensor, the sum
// of squares of the input rows routed to it and their count; gate and up see the same rows; quantize
// takes them per expert.
TEST(MoeTest, ImatrixCollectsPerExpert) {
  const std::string f16 = test::temp_dir() + "/tiny-qwen3moe-imatrix-F16.gguf";
  write_synthetic_model(parse_synthetic_spec("synthetic:tiny-qwen3moe:F16"), f16, 2);
  auto model = Model::load(gguf::GgufFile::open(f16));
  EngineOptions o;
  o.n_threads = 2;
  o.n_ctx = 128;
  auto engine = Engine::create(model, o);
  Imatrix im;
  engine->set_matmul_observer(imatrix_observer(im, false));
  std::vector<int32_t> tokens;
  for (int i = 0; i < 40; ++i) tokens.push_back((i * 37 + 11) % 512);
  engine->eval(engine->memory().create_sequence(), tokens, false);
  engine->set_matmul_observer(nullptr);
  for (int il = 0; il < 2; ++il) {
    const std::string b = "blk." + std::to_string(il) + ".";
    const ImatrixEntry& g = im.entries().at(b + "ffn_gate_exps.weight");
    const ImatrixEntry& u = im.entries().at(b + "ffn_up_exps.weight");
    const ImatrixEntry& d = im.entries().at(b + "ffn_down_exps.weight");
    ASSERT_EQ(g.counts.size(), 6u);
    EXPECT_EQ(g.n_cols(), 256);
    EXPECT_EQ(d.n_cols(), 256);
    EXPECT_EQ(std::accumulate(g.counts.begin(), g.counts.end(), int64_t{0}), 40 * 2) << "each token reaches 2 experts";
    EXPECT_EQ(g.counts, d.counts);
    EXPECT_EQ(g.sums, u.sums) << "gate and up multiply the same rows";
    for (size_t e = 0; e < 6; ++e)
      if (g.counts[e] == 0) {
        for (size_t j = 0; j < 256; ++j) EXPECT_EQ(g.sums[e * 256 + j], 0.0);
      }
    EXPECT_EQ(im.entries().at(b + "ffn_gate_inp.weight").counts.size(), 1u);
  }
  // Quantizing with it weights each expert's rows by that expert's values.
  QuantizeOptions q;
  q.mix = find_mix("Q4_K_M");
  q.n_threads = 2;
  const ImportanceData importance = im.importance("test.imatrix");
  q.imatrix = &importance;
  const QuantizePlan plan = plan_quantization(*gguf::GgufFile::open(f16), q);
  int with = 0;
  for (const auto& t : plan.tensors)
    if (t.name.find("_exps") != std::string::npos) {
      EXPECT_TRUE(t.uses_imatrix) << t.name;
      ++with;
    }
  EXPECT_EQ(with, 6);
}
