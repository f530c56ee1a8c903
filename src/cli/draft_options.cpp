// Draft-model flags and loading (draft_options.h).
#include "cli/draft_options.h"

#include "core/error.h"
#include "core/log.h"
#include "engine/mtp_drafter.h"

namespace roofline::cli {

void add_draft_options(CLI::App& app, DraftArgs& a) {
  app.add_option("--model-draft,--spec-draft-model", a.model,
                 "draft model for speculative decoding (-md): a GGUF file or synthetic:SHAPE:MIX sharing the target's vocabulary")
      ->envname("LLAMA_ARG_MODEL_DRAFT");
  app.add_option("--spec-type", a.spec_type,
                 "speculative decoding: draft-mtp drafts with the model's own MTP head (Qwen3.5 files that carry one), "
                 "draft-simple with -md, none")
      ->check(CLI::IsMember({"none", "draft-simple", "draft-mtp"}))->envname("LLAMA_ARG_SPEC_TYPE");
  app.add_option("--draft-max,--draft,--draft-n,--spec-draft-n-max", a.params.n_max,
                 "most tokens the draft proposes per step")
      ->capture_default_str()->envname("LLAMA_ARG_DRAFT_MAX");
  app.add_option("--draft-min,--draft-n-min,--spec-draft-n-min", a.params.n_min, "a draft shorter than this is not used")
      ->capture_default_str()->envname("LLAMA_ARG_DRAFT_MIN");
  app.add_option("--draft-p-min,--spec-draft-p-min", a.params.p_min,
                 "drafting stops when the draft's top probability falls under this (0: always draft --draft-max tokens)")
      ->capture_default_str()->envname("LLAMA_ARG_DRAFT_P_MIN");
  app.add_option("--gpu-layers-draft,--n-gpu-layers-draft,--spec-draft-ngl", a.n_gpu_layers,
                 "draft units on the GPU, as -ngl: a number, auto or all (-ngld)")
      ->capture_default_str()->envname("LLAMA_ARG_N_GPU_LAYERS_DRAFT");
}

void check_draft_args(const DraftArgs& a) {
  if (a.mtp() && !a.model.empty()) fail("--spec-type draft-mtp drafts with the model's own MTP head: leave out -md {}", a.model);
  if (a.spec_type == "draft-simple" && a.model.empty()) fail("--spec-type draft-simple needs a draft model (-md)");
  if (a.params.n_max < 1) fail("--draft-max {}: expected at least 1", a.params.n_max);
  if (a.params.n_min < 0 || a.params.n_min > a.params.n_max)
    fail("--draft-min {}: expected 0..--draft-max ({})", a.params.n_min, a.params.n_max);
  if (!(a.params.p_min >= 0 && a.params.p_min <= 1)) fail("--draft-p-min {}: expected 0..1", a.params.p_min);
  (void)parse_gpu_layers(a.n_gpu_layers);
}

std::unique_ptr<Drafter> load_draft(const DraftArgs& a, const ModelArgs& target_args, const Engine& target) {
  check_draft_args(a);
  if (a.mtp()) {
    check_draft_target(target.memory(), "--spec-type draft-mtp");
    EngineOptions o = target.options();
    o.n_seq_max = std::max(1, target_args.n_seq_max);
    o.f16_copies = F16Copies::Off;  // the memory left is the target's, for its own copies (load_draft's callers)
    auto mtp = std::make_unique<MtpDrafter>(target.model_ptr(), o, a.params);
    for (const std::string& line : mtp->engine().report()) log_info("MTP head: {}", line);
    log_info("speculative decoding: the model's MTP head, up to {} tokens per step (min {}, p-min {:.2f})", a.params.n_max,
             a.params.n_min, a.params.p_min);
    return mtp;
  }
  check_draft_target(target.memory(), "-md (a draft model)");
  ModelArgs d = target_args;
  d.model = a.model;
  d.n_gpu_layers = a.n_gpu_layers;
  // The draft follows every target sequence to its full length, plus each sequence's drafts and a block
  // (the target's pool is shared by target_args.n_seq_max sequences: serve's slots).
  d.n_ctx = target.options().n_ctx + std::max(1, target_args.n_seq_max) * (a.params.n_max + target.options().kv_block_size);
  d.n_batch = target.options().n_batch;
  d.cpu_moe = false;
  d.n_cpu_moe = 0;
  d.override_tensor.clear();
  d.f16_copies = "off";  // the memory left is the target's, for its own copies (load_draft's callers)
  d.defer_f16_copies = false;
  d.n_state_snapshots = 0;
  d.draft_rollback = false;
  std::shared_ptr<const Model> model;
  try {
    model = load_model(d);
  } catch (const Error& e) {
    fail("-md {}: {}", a.model, e.what());
  }
  check_draft_compatible(target.model(), *model);
  auto engine = create_engine(model, d);
  for (const std::string& line : engine->report()) log_info("draft: {}", line);
  auto draft = std::make_unique<DraftModel>(std::move(engine), a.params);
  log_info("speculative decoding: draft {} ({}), up to {} tokens per step (min {}, p-min {:.2f})", a.model, model->description(),
           a.params.n_max, a.params.n_min, a.params.p_min);
  return draft;
}

}  // namespace roofline::cli
