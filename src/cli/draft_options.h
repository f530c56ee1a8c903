// The draft-model flags of run, bench and serve (speculative decoding, engine/speculative.h), with
// llama.cpp's spellings: -md/--model-draft, --draft-max (--spec-draft-n-max), --draft-min,
// --draft-p-min, -ngld/--gpu-layers-draft; and loading the draft beside a loaded target.
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
  DraftParams params;
  bool given() const { return !model.empty(); }
};

void add_draft_options(CLI::App& app, DraftArgs& args);
// The values checked before anything loads (Error naming the flag).
void check_draft_args(const DraftArgs& args);
// Loads the draft (with the target's --tokenizer, threads, batch, KV types and context), checks that it
// shares the target's vocabulary and that the target's memory can be cut back; its report lines are
// logged. Error (one line) otherwise.
std::unique_ptr<DraftModel> load_draft(const DraftArgs& args, const ModelArgs& target_args, const Engine& target);

}  // namespace roofline::cli
