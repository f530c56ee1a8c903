// -sm row without a GPU: the backend that runs a slice of every layer per rank (engine/tensor_parallel.h),
// with CPU backends as ranks and the host reducer, against one CPU backend running the whole model:
// prompt and decode steps, two sequences in one step, one rank and splits 1:1 and 2:1; what it
// answers for memory, and what it refuses.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "engine/engine_test_util.h"
#include "engine/reference_forward.h"
#include "engine/tensor_parallel.h"
#include "test_util.h"

using namespace roofline;

namespace {

// Two sequences: the first `prompt` tokens of each in one step (every row's logits), then one token of
// each per step. Returns every logit row in step order.
std::vector<float> run_steps(Backend& b, const Model& m, const std::vector<int32_t>& tokens, size_t prompt) {
  const int n_vocab = m.hparams().n_vocab, block = 16;
  KvConfig kv;
  kv.n_blocks = 16;
  kv.block_size = block;
  b.init_kv(kv);
  b.init_state(2);
  b.init_snapshots(0);
  std::vector<float> out;
  int n_past = 0;
  for (size_t i = 0; i < tokens.size();) {
    const int n = i == 0 ? (int)prompt : 1;
    StepDesc st;
    for (int s = 0; s < 2; ++s) {
      StepSequence seq;
      seq.seq_id = s;
      seq.n_past = n_past;
      seq.n_new = n;
      seq.first_token = s * n;
      for (int blk = 0; blk * block < n_past + n; ++blk) seq.block_table.push_back(s * 8 + blk);
      for (int j = 0; j < n; ++j) {
        st.tokens.push_back(tokens[(i + (size_t)j + (size_t)s * 3) % tokens.size()]);
        st.positions.push_back(n_past + j);
        st.row_seq.push_back(s);
        st.logit_rows.push_back(s * n + j);
      }
      st.sequences.push_back(seq);
    }
    b.begin_step(st);
    b.embed();
    b.forward(0, m.hparams().n_layer);
    std::vector<float> l(st.logit_rows.size() * (size_t)n_vocab);
    b.output(l.data());
    out.insert(out.end(), l.begin(), l.end());
    n_past += n;
    i += (size_t)n;
  }
  return out;
}

// run_steps's logit rows from the float64 reference forward, one sequence at a time.
std::vector<double> reference_steps(const Model& m, const std::vector<int32_t>& tokens, size_t prompt) {
  std::vector<std::vector<double>> rows[2];
  for (int s = 0; s < 2; ++s) {
    test::ReferenceForward f(m);
    for (size_t i = 0; i < tokens.size(); ++i) rows[s].push_back(f.step(tokens[(i + (size_t)s * 3) % tokens.size()]));
  }
  std::vector<double> out;
  auto add = [&](int s, size_t i) { out.insert(out.end(), rows[s][i].begin(), rows[s][i].end()); };
  for (int s = 0; s < 2; ++s)
    for (size_t i = 0; i < prompt; ++i) add(s, i);
  for (size_t i = prompt; i < tokens.size(); ++i)
    for (int s = 0; s < 2; ++s) add(s, i);
  return out;
}

double nmse_double(const std::vector<float>& a, const std::vector<double>& ref) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    err += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  return err / norm;
}

std::unique_ptr<TensorParallelBackend> cpu_ranks(const std::shared_ptr<const Model>& model, const std::vector<double>& ts) {
  ModelSplit split = split_model(model, ts);
  std::vector<std::unique_ptr<Backend>> ranks;
  for (size_t i = 0; i < split.slices.size(); ++i) ranks.push_back(std::make_unique<cpu::CpuBackend>(1));
  return std::make_unique<TensorParallelBackend>(std::move(ranks), std::move(split.slices), make_host_reducer((int)ts.size()));
}

}  // namespace

TEST(TensorParallelTest, CpuRanksGiveTheLogitsOfOneBackend) {
  for (const char* spec : {"tiny-qwen3:F32", "tiny-qwen3:Q8_0", "tiny-llama:Q8_0", "tiny-qwen2:Q4_0", "tiny-gemma3:Q8_0", "tiny-gemma3:F32"}) {
    const auto model = test::tiny(spec);
    const HParams& hp = model->hparams();
    const LayerSet all{0, hp.n_layer, true, true};
    const auto tokens = test::some_tokens(12, hp.n_vocab, 5);
    cpu::CpuBackend one(1);
    one.load(model, all);
    const std::vector<float> want = run_steps(one, *model, tokens, 7);
    const std::vector<double> ref = reference_steps(*model, tokens, 7);
    const bool post_norms = (bool)model->layer(0)[LayerTensor::AttnPostNorm];
    uint64_t vector_bytes = 0;  // the 1-D tensors of the layers
    for (int il = 0; il < hp.n_layer; ++il)
      for (const Weight& w : model->layer(il).tensors)
        if (w && w.tensor->n_dims == 1) vector_bytes += w.bytes();
    for (const std::vector<double>& ts : {std::vector<double>{1}, std::vector<double>{1, 1}, std::vector<double>{2, 1}}) {
      auto tp = cpu_ranks(model, ts);
      tp->load(model, all);
      const std::vector<float> got = run_steps(*tp, *model, tokens, 7);
      ASSERT_EQ(got.size(), want.size());
      const double e = test::nmse(got.data(), want.data(), want.size());
      std::printf("%-18s over %zu ranks (-ts %g,...): NMSE against one backend %.3g\n", spec, ts.size(), ts[0], e);
      if (!post_norms) {
        EXPECT_LT(e, 1e-10) << spec << " over " << ts.size() << " ranks, -ts " << ts[0];
      } else {
        // Gemma's post norms scale each block's output to unit size after the sum, so the rounding of the
        // sum (partials of either sign) shows more: as close to the float64 reference as one backend is.
        const double e_one = nmse_double(want, ref), e_tp = nmse_double(got, ref);
        EXPECT_LT(e_tp, 4 * e_one + 1e-12) << spec << " over " << ts.size() << " ranks: " << e_tp << " against " << e_one;
      }
      // Weights: the ranks' slices together hold each matrix once (the output layer on rank 0 only); each
      // rank has its own copy of the norm weights.
      const uint64_t tp_bytes = tp->weight_bytes(*model, {0, hp.n_layer, false, false}),
                     one_bytes = one.weight_bytes(*model, {0, hp.n_layer, false, false});
      EXPECT_GE(tp_bytes, one_bytes) << spec;
      EXPECT_LE(tp_bytes, one_bytes + (ts.size() - 1) * vector_bytes) << spec;
      KvConfig kv;
      kv.block_size = 16;
      EXPECT_EQ(tp->kv_block_bytes(*model, all, kv), one.kv_block_bytes(*model, all, kv)) << spec;
      EXPECT_NE(tp->name().find("-sm row"), std::string::npos);
    }
  }
}

TEST(TensorParallelTest, RefusesWhatItCannotRun) {
  const auto model = test::tiny("tiny-qwen3:Q8_0");
  auto tp = cpu_ranks(model, {1, 1});
  // Importance matrices are collected on one device.
  EXPECT_THROW(tp->set_matmul_observer([](const gguf::TensorInfo&, const float*, int, int64_t, int) {}), Error);
  // Models it cannot split: one line naming why.
  for (const char* spec : {"tiny-qwen3moe:Q8_0", "tiny-qwen35:Q8_0"}) {
    try {
      split_model(test::tiny(spec), {1, 1});
      ADD_FAILURE() << spec << " was split";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("-sm row does not split"), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    }
  }
}
