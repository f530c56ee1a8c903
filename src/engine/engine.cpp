// Engine: placement of the model on backends, the shared KV cache, and the forward step that turns
// a batch into a step descriptor, runs every backend's layer range and returns the wanted logits.
#include "engine/engine.h"

#include <algorithm>
#include <set>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/host_experts.h"
#include "backend/gpu.h"
#include "engine/memory_plan.h"
#include "engine/placement.h"
#include "core/log.h"
#include "core/error.h"
#include "engine/sampler.h"
#include "engine/tensor_parallel.h"
#include "roofline_version.h"

namespace roofline {

class Engine::BackendCopies final : public SequenceMemory::Device {
 public:
  explicit BackendCopies(std::vector<std::unique_ptr<Backend>>& backends) : backends_(backends) {}
  void copy_kv_block(int src, int dst) override {
    for (auto& b : backends_) b->copy_kv_block(src, dst);
  }
  void copy_state(int src, int dst) override {
    for (auto& b : backends_) b->copy_state(src, dst);
  }
  void save_window(int cell, int first_block, int n_blocks, int snapshot) override {
    for (auto& b : backends_) b->save_window(cell, first_block, n_blocks, snapshot);
  }
  void load_window(int snapshot, int cell, int first_block, int n_blocks) override {
    for (auto& b : backends_) b->load_window(snapshot, cell, first_block, n_blocks);
  }

 private:
  std::vector<std::unique_ptr<Backend>>& backends_;
};

Engine::~Engine() = default;

std::unique_ptr<Engine> Engine::create(std::shared_ptr<const Model> model, const EngineOptions& options) {
  auto engine = std::unique_ptr<Engine>(new Engine());
  engine->model_ = model;
  engine->options_ = options;
  EngineOptions& o = engine->options_;
  const HParams& hp = model->hparams();
  if (o.n_ctx < 0) fail("context size {} is negative", o.n_ctx);
  if (o.n_ctx == 0) o.n_ctx = std::min(hp.n_ctx_train, 4096);
  if (o.n_batch <= 0) fail("batch size {} must be positive", o.n_batch);
  if (o.kv_block_size <= 0 || o.kv_block_size > 4096) fail("KV block size {} is out of range", o.kv_block_size);
  for (DType t : {o.type_k, o.type_v}) {
    if (t != DType::F32 && t != DType::F16 && t != DType::BF16 && t != DType::Q8_0 && t != DType::Q4_0)
      fail("KV cache type {} is not supported (use f16, bf16, q8_0 or q4_0)", dtype_name(t));
  }
  (void)experts_on_host(*model, o.n_cpu_moe, o.cpu_tensor_patterns);  // bad -ot patterns fail on every machine

  // Sliding-window layers keep a ring per sequence (the window plus a step's tokens, in whole blocks: the
  // GPU addresses it by block), not blocks: it cannot be cut back, so sequences take state cells. Without
  // recurrent layers (gemma3) prompt caching keeps window snapshots in host memory (windowed memory);
  // with them, the rings go with the states into state-cell snapshots.
  KvConfig kv = planned_kv_config(hp, o.n_ctx, o.n_batch, o.kv_block_size, o.type_k, o.type_v);
  const bool deltanet = hp.count_layers(MixerKind::DeltaNet) > 0;
  SequenceMemory::Options mo;
  mo.n_blocks = kv.n_blocks;
  mo.block_size = kv.block_size;
  mo.recurrent = deltanet || kv.swa_ring > 0;
  mo.windowed = kv.swa_ring > 0 && !deltanet;
  mo.ring = kv.swa_ring;
  mo.window = hp.sliding_window;
  mo.n_seq_max = o.n_seq_max;
  mo.n_snapshots = o.n_state_snapshots;
  mo.rollback = o.draft_rollback && mo.recurrent;
  engine->kv_ = kv;
  if (mo.recurrent && o.n_seq_max < 1) fail("the number of parallel sequences {} must be at least 1", o.n_seq_max);
  if (o.n_state_snapshots < 0) fail("the number of state snapshots {} cannot be negative", o.n_state_snapshots);
  const int n_cells = SequenceMemory::state_cells(mo);

  // What to write down before tuning: the build (commit, CUDA runtime and driver, the architectures
  // compiled in) and the model file's type; the GPU lines below add each GPU and its capability.
  engine->report_.push_back(fmt::format("roofline {} (commit {}), {}; model: {}", ROOFLINE_VERSION, ROOFLINE_GIT_COMMIT,
                                        gpu_build_info(), model->description()));

  // Placement: n_layer + 1 units; the last `units` of them on the GPUs (the output layer first).
  const int n_units = hp.n_layer + 1;
  int units = 0;
  std::vector<std::unique_ptr<Backend>> gpus;  // one per GPU of the list, in order
  std::vector<int> gpu_list;
  std::vector<double> weights, budgets;
  if (o.n_gpu_layers != 0) {
    const auto devices = gpu_devices();
    if (devices.empty()) {
      if (o.n_gpu_layers != EngineOptions::kGpuLayersAuto)
        log_warn("-ngl {}: {}; running on the CPU",
                 o.n_gpu_layers == EngineOptions::kGpuLayersAll ? std::string("all") : std::to_string(o.n_gpu_layers),
                 gpu_support_compiled() ? "no CUDA GPU was found" : "this build has no GPU backend");
    } else {
      if (o.main_gpu < 0 || o.main_gpu >= (int)devices.size()) fail("--main-gpu {}: {} GPUs found", o.main_gpu, devices.size());
      gpu_list = o.gpu_ids;
      if (gpu_list.empty()) {
        if (o.split_mode == EngineOptions::SplitMode::None || devices.size() == 1) gpu_list = {o.main_gpu};
        else for (const GpuInfo& g : devices) gpu_list.push_back(g.index);
      }
      for (int id : gpu_list)
        if (id < 0 || id >= (int)devices.size()) fail("GPU {} does not exist ({} GPUs found)", id, devices.size());
      if (o.vram_limit_gib.size() > 1 && o.vram_limit_gib.size() != gpu_list.size())
        fail("--vram-limit has {} values for {} GPUs (give one for every GPU, or one for all)", o.vram_limit_gib.size(),
             gpu_list.size());
      if (o.tensor_split.size() > gpu_list.size())
        fail("-ts has {} proportions for {} GPUs", o.tensor_split.size(), gpu_list.size());
      // The GEMM scratch by the smallest GPU of the list (as --vram-limit makes it), the same on all of them.
      double smallest_gpu = 0;
      for (size_t i = 0; i < gpu_list.size(); ++i) {
        double total = (double)devices[gpu_list[i]].total_bytes;
        if (!o.vram_limit_gib.empty()) total = std::min(total, o.vram_limit_gib[o.vram_limit_gib.size() == 1 ? 0 : i] * 1073741824.0);
        smallest_gpu = i == 0 ? total : std::min(smallest_gpu, total);
      }
      const double work_bytes = gpu_work_bytes(o.n_batch, hp.n_vocab, hp.n_ff, smallest_gpu);
      // MoE experts kept in host memory (--cpu-moe, --n-cpu-moe, -ot REGEX=CPU).
      std::string experts_note;
      const std::vector<bool> host_experts = experts_on_host(*model, o.n_cpu_moe, o.cpu_tensor_patterns, &experts_note);
      std::vector<GpuBackendOptions> gpu_options;
      if (std::count(host_experts.begin(), host_experts.end(), true) > 0) {
        uint64_t bytes = 0;
        int n = 0;
        for (int il = 0; il < hp.n_layer; ++il)
          if (host_experts[(size_t)il]) {
            ++n;
            for (LayerTensor t : {LayerTensor::FfnGateExps, LayerTensor::FfnUpExps, LayerTensor::FfnDownExps})
              bytes += model->layer(il)[t].bytes();
          }
        engine->report_.push_back(fmt::format("MoE experts of {} of {} layers in host memory, run on the CPU: {:.1f} MiB{}", n,
                                              hp.n_layer, bytes / 1048576.0, experts_note.empty() ? "" : " (" + experts_note + ")"));
      }
      for (size_t i = 0; i < gpu_list.size(); ++i) {
        const GpuInfo& g = devices[gpu_list[i]];
        GpuBackendOptions go;
        go.device = g.index;
        go.max_tokens = o.n_batch;
        go.n_ctx = o.n_ctx;
        go.kv_block_size = o.kv_block_size;
        go.experts_on_host = host_experts;
        go.n_host_threads = o.n_threads;
        go.gemm_scratch_bytes = gemm_scratch_bytes(smallest_gpu);
        go.dequant_ahead_slots = dequant_ahead_slots(smallest_gpu);
        go.f16_copies = o.f16_copies;
        go.f16_copies_max_bytes = o.f16_copies_max_gib * 1073741824.0;
        go.margin_bytes = o.gpu_margin_gib * 1073741824.0;
        if (!o.vram_limit_gib.empty()) go.vram_limit_bytes = o.vram_limit_gib[o.vram_limit_gib.size() == 1 ? 0 : i] * 1073741824.0;
        gpu_options.push_back(go);
        gpus.push_back(make_gpu_backend(go));
        double usable = (double)g.free_bytes;
        std::string limit_note;
        if (!o.vram_limit_gib.empty()) {
          const double limit = o.vram_limit_gib[o.vram_limit_gib.size() == 1 ? 0 : i] * 1073741824.0;
          if (limit < usable) {
            usable = limit;
            limit_note = fmt::format(", limited to {:.1f} GiB (--vram-limit)", limit / 1073741824.0);
          }
        }
        budgets.push_back(gpu_budget_bytes(usable, o.gpu_margin_gib, work_bytes));
        weights.push_back(o.tensor_split.empty() ? std::max(usable, 1.0) : i < o.tensor_split.size() ? o.tensor_split[i] : 0.0);
        const std::string code_note = g.code_arch > 0 && g.code_arch < 10 * g.cc_major + g.cc_minor
                                          ? fmt::format(", kernels running as sm_{} (no code for {}.{} in this build)", g.code_arch,
                                                        g.cc_major, g.cc_minor)
                                          : "";
        engine->report_.push_back(fmt::format("GPU {}: {} (compute capability {}.{}, {} SMs{}), {:.1f} GiB total, {:.1f} GiB free{}",
                                              g.index, g.name, g.cc_major, g.cc_minor, g.sm_count, code_note,
                                              g.total_bytes / 1073741824.0, g.free_bytes / 1073741824.0, limit_note));
      }
      // Bytes GPU i needs for model units [first, end): weights, plus KV blocks of its layers.
      auto cost = [&](int i, int first, int end) {
        LayerSet set{first, std::min(end, hp.n_layer), first == 0, end == n_units};
        return (double)gpus[i]->weight_bytes(*model, set) + (double)gpus[i]->kv_block_bytes(*model, set, kv) * kv.n_blocks +
               ((double)gpus[i]->state_cell_bytes(*model, set) + (double)gpus[i]->swa_cell_bytes(*model, set, kv)) * n_cells;
      };
      static_assert(EngineOptions::kGpuLayersAuto == -1 && EngineOptions::kGpuLayersAll == -2);
      if (o.split_mode == EngineOptions::SplitMode::Row && gpus.size() > 1) {
        units = engine->place_row_split(gpus, gpu_list, weights, budgets, kv, n_cells, work_bytes);
        gpus.clear();
      } else {
        units = choose_gpu_units(o.n_gpu_layers, n_units, weights, budgets, cost);  // auto: as many as fit every budget
        const bool placement_given = o.n_cpu_moe > 0 || !o.cpu_tensor_patterns.empty();
        if (o.n_gpu_layers == EngineOptions::kGpuLayersAuto && units < n_units && hp.is_moe() && !placement_given) {
          // A MoE model that does not fit: keep the experts of the first n layers in host memory (as
          // --n-cpu-moe n), the fewest n with which every unit fits (their file bytes: the device's
          // layout of a stacked expert tensor is one allocation of about the same size).
          auto expert_bytes = [&](int il) {
            double b = 0;
            for (LayerTensor t : {LayerTensor::FfnGateExps, LayerTensor::FfnUpExps, LayerTensor::FfnDownExps})
              b += (double)model->layer(il)[t].bytes();
            return b;
          };
          for (int n = 1; n <= hp.n_layer; ++n) {
            auto cost_n = [&](int i, int first, int end) {
              double c = cost(i, first, end);
              for (int il = first; il < std::min({end, hp.n_layer, n}); ++il) c -= expert_bytes(il);
              return c;
            };
            if (fit_units(n_units, weights, budgets, cost_n) < n_units) continue;
            const std::vector<bool> first_n = experts_on_host(*model, n, {});
            for (size_t i = 0; i < gpus.size(); ++i) {
              gpu_options[i].experts_on_host = first_n;
              gpus[i] = make_gpu_backend(gpu_options[i]);
            }
            units = fit_units(n_units, weights, budgets, cost);
            double bytes = 0;
            for (int il = 0; il < n; ++il) bytes += expert_bytes(il);
            engine->report_.push_back(fmt::format("-ngl auto: the MoE experts of the first {} of {} layers stay in host memory, run "
                                                  "on the CPU ({:.1f} MiB; as --n-cpu-moe {}), so that every layer fits",
                                                  n, hp.n_layer, bytes / 1048576.0, n));
            break;
          }
        }
        // The memory bill of each GPU, as `roofline plan` prints it (memory_plan.h).
        for (const GpuRange& r : gpu_ranges(n_units, units, weights)) {
          LayerSet set{r.first_unit, std::min(r.end_unit, hp.n_layer), r.first_unit == 0, r.end_unit == n_units};
          engine->report_.push_back(fmt::format(
              "GPU {} bill: weights {:.2f} GiB, KV cache {:.2f} GiB, recurrent state and sliding-window rings {:.2f} GiB, compute buffers {:.2f} GiB, "
              "margin {:.2f} GiB; budget for weights, KV and state {:.2f} GiB",
              gpu_list[r.gpu], gpus[r.gpu]->weight_bytes(*model, set) / 1073741824.0,
              (double)gpus[r.gpu]->kv_block_bytes(*model, set, kv) * kv.n_blocks / 1073741824.0,
              ((double)gpus[r.gpu]->state_cell_bytes(*model, set) + (double)gpus[r.gpu]->swa_cell_bytes(*model, set, kv)) * n_cells / 1073741824.0, work_bytes / 1073741824.0,
              o.gpu_margin_gib, std::max(0.0, budgets[r.gpu]) / 1073741824.0));
        }
        // With a memory limit, an explicit -ngl that does not fit is refused here (the real allocation
        // would succeed on the larger GPU and defeat the limit).
        if (!o.vram_limit_gib.empty() && units > 0)
          for (const GpuRange& r : gpu_ranges(n_units, units, weights)) {
            const double need = cost(r.gpu, r.first_unit, r.end_unit);
            if (need > budgets[r.gpu])
              fail("GPU {} needs {:.2f} GiB for its {} units (weights and KV cache), more than the {:.2f} GiB --vram-limit leaves "
                   "(after {:.1f} GiB of margin and work buffers); lower -ngl, -c or the KV types, use a smaller quant, or add a GPU",
                   gpu_list[r.gpu], need / 1073741824.0, r.end_unit - r.first_unit,
                   std::max(0.0, budgets[r.gpu]) / 1073741824.0, (o.gpu_margin_gib * 1073741824.0 + work_bytes) / 1073741824.0);
          }
      }  // -sm layer
    }
  }
  engine->gpu_units_ = units;
  const int first_gpu_layer = n_units - units;  // as a unit index: layers first_gpu_layer.. go to the GPUs
  if (units < n_units) {
    auto cpu = std::make_unique<cpu::CpuBackend>(o.n_threads);
    LayerSet set{0, std::min(first_gpu_layer, hp.n_layer), true, units == 0};
    cpu->load(model, set);
    engine->report_.push_back(
        cpu->packed_count() > 0
            ? fmt::format("CPU: {} threads, {} kernels{}; {} weight matrices repacked for them ({:.1f} MiB)", cpu->n_threads(),
                          cpu::cpu_simd_name(),
                          cpu::prompt_kernels_enabled() ? " (prompts on AMX-INT8 tiles)" : "",
                          cpu->packed_count(), (double)cpu->packed_bytes() / (1024.0 * 1024.0))
            : fmt::format("CPU: {} threads, {} kernels", cpu->n_threads(), cpu::cpu_simd_name()));
    cpu->init_kv(kv);
    cpu->init_state(n_cells);
    cpu->init_snapshots(mo.windowed ? o.n_state_snapshots : 0);
    engine->placement_.push_back({cpu.get(), set});
    engine->backends_.push_back(std::move(cpu));
  }
  if (units > 0 && engine->row_split_) {
    LayerSet set{first_gpu_layer, hp.n_layer, first_gpu_layer == 0, true};
    Backend* gpu = engine->row_split_.get();
    gpu->load(model, set);
    gpu->init_kv(kv);
    gpu->init_state(n_cells);
    gpu->init_snapshots(mo.windowed ? o.n_state_snapshots : 0);
    engine->placement_.push_back({gpu, set});
    engine->backends_.push_back(std::move(engine->row_split_));
    engine->report_.push_back(fmt::format("offloaded {}/{} layers to {} GPUs, split by row: {}", units, n_units, gpu_list.size(),
                                          gpu->name()));
  } else if (units > 0) {
    std::string shares;
    int n_shares = 0;
    for (const GpuRange& r : gpu_ranges(n_units, units, weights)) {
      LayerSet set{r.first_unit, std::min(r.end_unit, hp.n_layer), r.first_unit == 0, r.end_unit == n_units};
      Backend* gpu = gpus[r.gpu].get();
      gpu->load(model, set);
      gpu->init_kv(kv);
      gpu->init_state(n_cells);
      gpu->init_snapshots(mo.windowed ? o.n_state_snapshots : 0);
      engine->placement_.push_back({gpu, set});
      engine->backends_.push_back(std::move(gpus[r.gpu]));
      shares += fmt::format("{}GPU {}: {}", shares.empty() ? "" : ", ", gpu_list[r.gpu], r.end_unit - r.first_unit);
      ++n_shares;
    }
    if (n_shares == 1)
      engine->report_.push_back(fmt::format("offloaded {}/{} layers to GPU (the output layer first)", units, n_units));
    else
      engine->report_.push_back(fmt::format("offloaded {}/{} layers to {} GPUs, split by layer ({})", units, n_units,
                                            n_shares, shares));
  }
  // Last, once every backend has its weights, KV cache and state: f16 copies from what memory is left.
  if (!o.defer_f16_copies) engine->keep_f16_copies();
  engine->copies_ = std::make_unique<BackendCopies>(engine->backends_);
  engine->memory_ = std::make_unique<SequenceMemory>(mo, engine->copies_.get());
  return engine;
}

std::vector<std::string> Engine::keep_f16_copies() {
  std::vector<std::string> lines;
  if (f16_copies_kept_) return lines;
  f16_copies_kept_ = true;
  for (auto& b : backends_) {
    const std::string line = b->keep_f16_copies();
    if (!line.empty()) lines.push_back(line);
  }
  report_.insert(report_.end(), lines.begin(), lines.end());
  return lines;
}

std::vector<float> Engine::decode(const std::vector<BatchRow>& batch) {
  std::vector<float> logits;
  start_step(batch, false);
  end_step(logits, nullptr);
  return logits;
}

const Engine::StepOutput& Engine::step(const std::vector<BatchRow>& batch, const float* input) {
  launch(batch, input);
  return finish();
}

void Engine::launch(const std::vector<BatchRow>& batch, const float* input) {
  start_step(batch, true, input);
  launched_ = batch;  // which rows asked for what, for finish()
}

const Engine::StepOutput& Engine::finish() {
  StepOutput& out = step_out_;
  const float* rows = nullptr;
  const bool packed = end_step(out.buffer, &out.argmax, &rows);
  const size_t n_vocab = (size_t)model_->hparams().n_vocab;
  out.logits.clear();
  size_t k = 0;
  for (const BatchRow& row : launched_)
    if (row.want_logits) out.logits.push_back(packed && row.argmax_only ? nullptr : rows + n_vocab * k++);
  out.hidden.clear();
  out.hidden_buffer.swap(hidden_out_);
  const size_t n_embd = (size_t)model_->hparams().n_embd;
  k = 0;
  for (const BatchRow& row : launched_)
    if (row.want_hidden) out.hidden.push_back(out.hidden_buffer.data() + n_embd * k++);
  return out;
}

void Engine::start_step(const std::vector<BatchRow>& batch, bool allow_argmax, const float* input) {
  ROOFLINE_CHECK(!in_step_, "a forward step was started while another was in flight");
  const int n = (int)batch.size();
  if (n > options_.n_batch) fail("a batch of {} tokens exceeds the batch size {}", n, options_.n_batch);
  const int n_vocab = model_->hparams().n_vocab;

  StepDesc& step = step_desc_;
  step.tokens.clear();
  step.positions.clear();
  step.row_seq.clear();
  step.logit_rows.clear();
  step.argmax_only.clear();
  step.argmax_allowed.clear();
  step.hidden_rows.clear();
  step.sequences.clear();
  std::set<int> seen;
  std::vector<std::pair<int, int>>& runs = runs_;  // (seq, n_new) in batch order
  runs.clear();
  for (int r = 0; r < n; ++r) {
    const BatchRow& row = batch[r];
    if (row.token < 0 || row.token >= n_vocab) fail("token id {} is out of range [0, {})", row.token, n_vocab);
    if (!memory_->has_sequence(row.seq)) fail("unknown sequence {}", row.seq);
    if (r == 0 || batch[r - 1].seq != row.seq) {
      if (!seen.insert(row.seq).second) fail("the rows of sequence {} are not contiguous in the batch", row.seq);
      runs.push_back({row.seq, 0});
    }
    runs.back().second++;
  }
  int blocks = 0;
  for (auto& [seq, n_new] : runs) {
    if (memory_->length(seq) + n_new > options_.n_ctx)
      fail("sequence {} would reach {} positions, more than the context size {}", seq, memory_->length(seq) + n_new, options_.n_ctx);
    blocks += memory_->blocks_needed(seq, n_new);
  }
  if (blocks > memory_->free_blocks())
    fail("the KV cache is full: this step needs {} more blocks, {} are free", blocks, memory_->free_blocks());
  for (auto& [seq, n_new] : runs) ROOFLINE_CHECK(memory_->reserve(seq, n_new));
  if (n == 0) {
    in_step_ = true;
    return;
  }

  int row = 0;
  for (auto& [seq, n_new] : runs) {
    StepSequence s;
    s.seq_id = seq;
    s.n_past = memory_->length(seq);
    s.n_new = n_new;
    s.first_token = row;
    s.block_table = memory_->block_table(seq);
    s.state_cell = memory_->state_cell(seq);
    for (int i = 0; i < n_new; ++i, ++row) {
      step.tokens.push_back(batch[row].token);
      step.positions.push_back(s.n_past + i);
      step.row_seq.push_back((int)step.sequences.size());
      if (batch[row].want_logits) {
        step.logit_rows.push_back(row);
        step.argmax_only.push_back(allow_argmax && batch[row].argmax_only ? 1 : 0);
        step.argmax_allowed.push_back(allow_argmax && batch[row].argmax_only ? batch[row].allowed : nullptr);
      }
      if (batch[row].want_hidden) step.hidden_rows.push_back(row);
    }
    step.sequences.push_back(std::move(s));
  }

  // Every backend but the one holding the output unit runs to completion here (the hidden state
  // crosses as host floats); the last one's layers are started and, on a GPU, left running.
  const int n_embd = model_->hparams().n_embd;
  for (size_t i = 0; i < placement_.size(); ++i) {
    Placement& p = placement_[i];
    p.backend->begin_step(step);
    if (p.layers.embedding && input) {
      p.backend->set_hidden(input);
    } else if (p.layers.embedding) {
      p.backend->embed();
    } else {
      p.backend->set_hidden(hidden_.data());
    }
    p.backend->forward(p.layers.begin, p.layers.end);
    if (!p.layers.output) {
      hidden_.resize((size_t)n * n_embd);
      p.backend->get_hidden(hidden_.data());
    }
  }
  in_step_ = true;
}

bool Engine::end_step(std::vector<float>& logits, std::vector<int32_t>* argmax, const float** view) {
  ROOFLINE_CHECK(in_step_, "finish() without a step in flight");
  in_step_ = false;
  const StepDesc& step = step_desc_;
  const int n_vocab = model_->hparams().n_vocab;
  const size_t n_logit = step.logit_rows.size();
  if (argmax) argmax->assign(n_logit, -1);
  hidden_out_.clear();
  if (step.tokens.empty()) {
    logits.clear();
    if (view) *view = logits.data();
    return false;
  }
  Backend* out_backend = placement_.back().backend;
  if (!step.hidden_rows.empty()) {
    hidden_out_.resize(step.hidden_rows.size() * (size_t)model_->hparams().n_embd);
    out_backend->output_hidden(hidden_out_.data());
  }
  // Greedy rows: picked by the output backend when it can (their logits then stay on the device),
  // else here from the logits.
  size_t n_greedy = 0;
  for (uint8_t g : step.argmax_only) n_greedy += g;
  const bool device_argmax = argmax && n_greedy > 0 && out_backend->supports_output_argmax();
  const bool in_place = view && out_backend->keeps_host_logits();
  logits.resize(in_place ? 0 : (device_argmax ? n_logit - n_greedy : n_logit) * (size_t)n_vocab);
  float* dst = in_place ? nullptr : logits.data();
  if (device_argmax) out_backend->output_argmax(dst, argmax->data());
  else out_backend->output(dst);
  const float* rows = in_place ? out_backend->host_logits() : logits.data();
  if (view) *view = rows;
  for (auto& [seq, n_new] : runs_) memory_->commit(seq, n_new);
  if (argmax && n_greedy > 0 && !device_argmax)
    for (size_t i = 0; i < n_logit; ++i)
      if (step.argmax_only[i]) {
        const float* row = rows + i * (size_t)n_vocab;
        (*argmax)[i] = step.argmax_allowed[i] ? argmax_allowed(row, n_vocab, step.argmax_allowed[i]) : argmax_logits(row, n_vocab);
      }
  return device_argmax;
}

std::vector<float> Engine::eval(int seq, std::span<const int32_t> tokens, bool all_logits) {
  std::vector<float> out;
  const size_t n_vocab = (size_t)this->n_vocab();
  for (size_t start = 0; start < tokens.size(); start += (size_t)options_.n_batch) {
    const size_t end = std::min(tokens.size(), start + (size_t)options_.n_batch);
    std::vector<BatchRow> batch;
    for (size_t i = start; i < end; ++i) batch.push_back({seq, tokens[i], all_logits || i + 1 == tokens.size()});
    std::vector<float> logits = decode(batch);
    if (all_logits) out.insert(out.end(), logits.begin(), logits.end());
    else if (end == tokens.size()) out = std::move(logits);
  }
  if (!all_logits) ROOFLINE_CHECK(tokens.empty() || out.size() == n_vocab);
  return out;
}

std::vector<float> Engine::eval_hidden(int seq, std::span<const int32_t> tokens) {
  std::vector<float> out;
  out.reserve(tokens.size() * (size_t)model_->hparams().n_embd);
  for (size_t start = 0; start < tokens.size(); start += (size_t)options_.n_batch) {
    const size_t end = std::min(tokens.size(), start + (size_t)options_.n_batch);
    std::vector<BatchRow> batch;
    for (size_t i = start; i < end; ++i) batch.push_back({seq, tokens[i], false, false, true});
    launch(batch);
    finish();
    out.insert(out.end(), step_out_.hidden_buffer.begin(), step_out_.hidden_buffer.end());
  }
  return out;
}

void Engine::set_matmul_observer(Backend::MatmulObserver observer) {
  for (auto& b : backends_) b->set_matmul_observer(observer);
}

namespace {
// What any backend lists (ascending, once each).
template <typename List>
std::vector<int> backends_union(const std::vector<std::unique_ptr<Backend>>& backends, List list) {
  std::vector<int> all;
  for (const auto& b : backends) {
    const std::vector<int> v = list(*b);
    all.insert(all.end(), v.begin(), v.end());
  }
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  return all;
}
}  // namespace

std::vector<int> Engine::decode_graph_depths() const {
  return backends_union(backends_, [&](const Backend& b) { return b.decode_graph_depths(options_.n_ctx); });
}

std::vector<int> Engine::decode_graph_rows() const {
  return backends_union(backends_, [](const Backend& b) { return b.decode_graph_rows(); });
}

size_t Engine::captured_graphs() const {
  size_t n = 0;
  for (const auto& b : backends_) n += b->captured_graphs();
  return n;
}

std::vector<Engine::PlacedRange> Engine::placements() const {
  std::vector<PlacedRange> out;
  for (const Placement& p : placement_)
    out.push_back({p.backend->name(), p.layers, dynamic_cast<const cpu::CpuBackend*>(p.backend) == nullptr});
  return out;
}

std::vector<std::string> Engine::report() const {
  std::vector<std::string> lines = report_;
  const HParams& hp = model_->hparams();
  for (const Placement& p : placement_) {
    lines.push_back(fmt::format("{}: layers {}..{}{}{}, {:.1f} MiB of weights", p.backend->name(), p.layers.begin,
                                p.layers.end - 1, p.layers.embedding ? " + embedding" : "", p.layers.output ? " + output" : "",
                                p.backend->weight_bytes(*model_, p.layers) / 1048576.0));
  }
  const KvConfig& kv = kv_;
  uint64_t kv_bytes = 0, swa_bytes = 0;
  for (const Placement& p : placement_) {
    kv_bytes += p.backend->kv_block_bytes(*model_, p.layers, kv) * kv.n_blocks;
    swa_bytes += p.backend->swa_cell_bytes(*model_, p.layers, kv);
  }
  // Layers with paged KV: the backends' block bytes over one layer's (a GPU keeps its sliding layers paged).
  const uint64_t layer_block = (uint64_t)kv.block_size * (dtype_row_bytes(kv.type_k, hp.kv_dim_k()) + dtype_row_bytes(kv.type_v, hp.kv_dim_v()));
  const int n_paged = kv.n_blocks > 0 ? (int)(kv_bytes / kv.n_blocks / layer_block) : 0;
  lines.push_back(fmt::format("KV cache: {} positions ({} blocks of {}), K {}, V {}, {:.1f} MiB{}", memory_->capacity_tokens(),
                              kv.n_blocks, kv.block_size, dtype_name(kv.type_k), dtype_name(kv.type_v), kv_bytes / 1048576.0,
                              n_paged < hp.n_layer ? fmt::format(" ({} of {} layers keep a KV cache)", n_paged, hp.n_layer) : ""));
  if (kv.swa_ring > 0) {
    const bool windowed = memory_->windowed();  // snapshots in host memory, else state cells
    const int n_cells = options_.n_seq_max * (options_.draft_rollback ? 2 : 1) + (windowed ? 0 : options_.n_state_snapshots);
    uint64_t snap_bytes = 0;
    for (const Placement& p : placement_) snap_bytes += p.backend->swa_snapshot_bytes(*model_, p.layers, kv);
    lines.push_back(fmt::format("sliding-window KV: {} layers keep the last {} positions ({} with a step's tokens) per sequence, "
                                "{:.1f} MiB per sequence, {} sequence{}{}{}, {:.1f} MiB",
                                hp.count_sliding_layers(0, hp.n_layer), hp.sliding_window, kv.swa_ring, swa_bytes / 1048576.0,
                                options_.n_seq_max, options_.n_seq_max == 1 ? "" : "s",
                                options_.n_state_snapshots && !windowed ? fmt::format(" + {} snapshots for prompt caching", options_.n_state_snapshots) : "",
                                options_.draft_rollback ? fmt::format(" + {} kept for rejected drafts", options_.n_seq_max) : "",
                                (double)swa_bytes * n_cells / 1048576.0));
    if (windowed && options_.n_state_snapshots > 0)
      lines.push_back(fmt::format("prompt-cache snapshots of the sliding layers: {} x {:.1f} MiB (the {} positions before a block "
                                  "boundary) in host memory, {:.1f} MiB",
                                  options_.n_state_snapshots, snap_bytes / 1048576.0, kv.swa_snapshot_blocks * kv.block_size,
                                  (double)snap_bytes * options_.n_state_snapshots / 1048576.0));
    const int n_global = hp.count_layers(MixerKind::Attention) - hp.count_sliding_layers(0, hp.n_layer);
    lines.push_back(fmt::format("KV memory: {:.1f} MiB ({} global layer{} x {} positions {:.1f} MiB + sliding-window rings {:.1f} MiB){}",
                                (kv_bytes + (double)swa_bytes * n_cells) / 1048576.0, n_global, n_global == 1 ? "" : "s",
                                memory_->capacity_tokens(), kv_bytes / 1048576.0, (double)swa_bytes * n_cells / 1048576.0,
                                windowed && options_.n_state_snapshots > 0
                                    ? fmt::format(", + {:.1f} MiB of snapshots in host memory", (double)snap_bytes * options_.n_state_snapshots / 1048576.0)
                                    : ""));
  }
  if (hp.count_layers(MixerKind::DeltaNet) > 0) {
    const int n_cells = options_.n_seq_max * (options_.draft_rollback ? 2 : 1) + options_.n_state_snapshots;
    uint64_t cell_bytes = 0;
    for (const Placement& p : placement_) cell_bytes += p.backend->state_cell_bytes(*model_, p.layers);
    lines.push_back(fmt::format("recurrent state: {:.1f} MiB per sequence ({} DeltaNet layers), {} sequences{}{}, {:.1f} MiB",
                                cell_bytes / 1048576.0, hp.count_layers(MixerKind::DeltaNet), options_.n_seq_max,
                                options_.n_state_snapshots ? fmt::format(" + {} snapshots for prompt caching", options_.n_state_snapshots) : "",
                                options_.draft_rollback ? fmt::format(" + {} kept for rejected drafts", options_.n_seq_max) : "",
                                (double)cell_bytes * n_cells / 1048576.0));
  }
  return lines;
}

}  // namespace roofline
