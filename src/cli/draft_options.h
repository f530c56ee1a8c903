// The draft flags of run, bench and serve (speculative decoding, engine/speculative.h), with llama.cpp's
// spellings: -md/--model-draft, --spec-type draft-mtp (the model's own MTP head, engine/mtp_drafter.h),
// --draft-max (--spec-draft-n-max), --draft-min, --draft-p-min, -ngld/--gpu-layers-draft; and loading
// the drafter beside a loaded target.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "cli/model_options.h"
#include "engine/speculative.h"

namespace roofline::cli {

struct DraftArgs {
  std::string model;                  // -md: GGUF path or synthetic:SHAPE:MIX ("" : no speculative decoding)
  std::string n_gpu_layers = "auto";  // -ngld: as -ngl, for the draft
  std::string spec_type;              // --spec-type: draft-mtp, draft-simple (-md) or none
  DraftParams params;
  bool mtp() const { return spec_type == "draft-mtp"; }
  bool given() const { return !model.empty() || mtp(); }
};

void add_draft_options(CLI::App& app, DraftArgs& args);
// The values checked before anything loads (Error naming the flag).
void check_draft_args(const DraftArgs& args);
// Loads the draft (with the target's --tokenizer, threads, batch, KV types and context), checks that it
// shares the target's vocabulary and that the target's memory can go back; or, with --spec-type
// draft-mtp, builds the MTP drafter from the target's own file. Its report lines are logged. Error (one
// line) otherwise (e.g. a file without an MTP block).
std::unique_ptr<Drafter> load_draft(const DraftArgs& args, const ModelArgs& target_args, const Engine& target);

}  // namespace roofline::cli
