// `roofline plan -m MODEL [--gpu NAME|auto] [--vram GiB] [-c N] [-np N] [-ctk T -ctv T] [-ngl N|auto]
// [--json]`: what a model will do on a card before one owns the card or downloads the file: the
// memory bill per device, the units -ngl auto offloads, predicted decode/prefill rates with their
// derivation, recommendations when it does not fit, and the `roofline serve` command line.
// MODEL: a GGUF file, synthetic:SHAPE:MIX, or a Hugging Face config.json (or its folder) with --type.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "backend/cpu/matmul.h"
#include "backend/gpu.h"
#include "cli/command.h"
#include "cli/model_options.h"
#include "core/log.h"
#include "engine/engine.h"
#include "engine/memory_plan.h"
#include "engine/roofline_model.h"
#include "model/hf_config_shape.h"
#include "model/model_file.h"
#include "model/synthetic.h"

namespace roofline::cli {
namespace {

using nlohmann::ordered_json;
constexpr double kGiB = 1073741824.0;

bool is_hf_config(const std::string& path) {
  std::error_code ec;
  if (path.size() >= 5 && path.substr(path.size() - 5) == ".json") return true;
  return std::filesystem::is_directory(path, ec) && std::filesystem::exists(std::filesystem::path(path) / "config.json", ec);
}

std::shared_ptr<const Model> layout_model(const ModelShape& shape, const QuantMix* mix, const std::string& name) {
  SyntheticSpec spec;
  spec.shape = shape;
  spec.mix = mix;
  SyntheticLayout layout = synthetic_layout(spec);
  return Model::load(gguf::GgufFile::from_parts(name, std::move(layout.metadata), std::move(layout.tensors), nullptr));
}

// The card: a table entry, or the local GPU (its free memory and measured bandwidth) for "auto".
GpuSpec resolve_gpu(const std::string& name, double cuda_context_gib) {
  if (name != "auto") {
    const GpuSpec* g = find_gpu_spec(name);
    if (!g) fail("--gpu '{}': unknown card (known: {}, or auto for this machine's GPU)", name, gpu_table_names());
    GpuSpec spec = *g;
    if (spec.host) spec.memory_gib = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE) / kGiB;
    return spec;
  }
  const auto devices = gpu_devices();
  if (devices.empty()) {  // no GPU: this machine's CPU, measured
    log_info("--gpu auto: {}: planning for this machine's CPU (name a card with --gpu to plan for it)",
             gpu_support_compiled() ? "no CUDA GPU was found" : "this build has no GPU backend");
    GpuSpec spec = *find_gpu_spec("cpu");
    spec.display_name = "this machine's CPU";
    spec.memory_gib = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE) / kGiB;
    spec.measured = true;
    return spec;
  }
  GpuSpec spec = local_gpu_spec(devices[0], cuda_context_gib);
  spec.peak_gbs = measure_gpu_read_bandwidth(devices[0].index);
  spec.stream_fraction = 1.0;
  return spec;
}

int run(int argc, char** argv) {
  CLI::App app{"Plan a model on a GPU before owning either: memory bill, layers on the GPU, predicted speed, serve command"};
  std::string model_path, type_name, gpu_name = "auto", ngl = "auto", ctk = "f16", ctv = "f16";
  double vram = 0, vram_limit = 0;
  int n_ctx = 0, n_parallel = 4, n_batch = 512;
  bool json = false, no_prompt_cache = false;
  app.add_option("-m,--model", model_path, "a GGUF file, synthetic:SHAPE:MIX, or a Hugging Face config.json (with --type)")->required();
  app.add_option("--type", type_name, "for a config.json: the quantization mix the file would get (Q4_K_M, Q8_0, ...)");
  app.add_option("--gpu", gpu_name, "the card: " + gpu_table_names() + ", or auto (this machine's GPU; without one, this machine's CPU, measured)")->capture_default_str();
  app.add_option("--vram", vram, "the card's memory in GiB, instead of the table's (for cpu: the host's RAM)");
  app.add_option("--vram-limit", vram_limit, "as serve's --vram-limit: use at most this many GiB of the card");
  app.add_option("-c,--ctx-size", n_ctx, "KV positions shared by the slots, as serve's -c (0: the model's, capped at 16384)");
  app.add_option("--parallel", n_parallel, "slots (-np)")->capture_default_str();
  app.add_option("-b,--batch-size", n_batch, "most tokens per forward step")->capture_default_str();
  app.add_option("--cache-type-k", ctk, "K cache type: f16, bf16, q8_0, q4_0 (-ctk)")->capture_default_str();
  app.add_option("--cache-type-v", ctv, "V cache type: f16, bf16, q8_0, q4_0 (-ctv)")->capture_default_str();
  app.add_option("--n-gpu-layers,--gpu-layers", ngl, "units on the GPU: a number, auto or all (-ngl)")->capture_default_str();
  app.add_flag("--no-prompt-cache", no_prompt_cache, "as serve: no state snapshots for recurrent models");
  std::string f16_copies = "auto";
  app.add_option("--f16-copies", f16_copies, "as serve: f16 copies of the GPU weights for prompts, from the memory the bill leaves "
                 "(auto, on, off, or GiB)")->capture_default_str();
  std::string spec_type;
  app.add_option("--spec-type", spec_type, "as serve: speculative decoding (draft-mtp, draft-simple), which keeps a second "
                 "recurrent state per slot")
      ->check(CLI::IsMember({"none", "draft-simple", "draft-mtp"}));
  int draft_max = PlanSettings{}.draft_max;
  app.add_option("--draft-max,--draft,--draft-n,--spec-draft-n-max", draft_max,
                 "as serve: most tokens drafted per step (with --spec-type draft-mtp, the MTP head's KV holds them)")
      ->capture_default_str();
  double cache_ram_mib = PlanSettings{}.cache_ram_mib;
  app.add_option("--cache-ram", cache_ram_mib, "as serve's -cram: MiB of host memory for sliding-window snapshots (-1: no limit)")
      ->capture_default_str();
  app.add_flag("--json", json, "print JSON (fits, n_gpu_layers, decode_tok_s, prefill_tok_s, bill, ...)");
  app.footer(kExitStatusHelp);
  if (int rc = parse_args(app, argc, argv); rc >= 0) return rc;

  PlanSettings settings;
  settings.n_ctx = n_ctx;
  settings.n_parallel = n_parallel;
  settings.n_batch = n_batch;
  settings.type_k = parse_cache_type(ctk);
  settings.type_v = parse_cache_type(ctv);
  settings.n_gpu_layers = parse_gpu_layers(ngl);
  settings.prompt_cache = !no_prompt_cache;
  double f16_copies_cap = 0;
  settings.f16_copies = parse_f16_copies(f16_copies, f16_copies_cap) != F16Copies::Off;
  settings.f16_copies_max_gib = f16_copies_cap;
  settings.speculative = !spec_type.empty() && spec_type != "none";
  settings.cache_ram_mib = cache_ram_mib;
  settings.draft_max = draft_max;
  if (draft_max < 1) fail("--draft-max {}: expected at least 1", draft_max);
  if (n_ctx < 0) fail("-c {}: the context size cannot be negative (0: the model's)", n_ctx);
  if (n_parallel < 1 || n_parallel > kMaxSlots) fail("-np {}: expected 1..{} slots", n_parallel, kMaxSlots);
  if (app.count("--vram") && !(vram > 0 && vram < 1e6)) fail("--vram {}: expected a positive size in GiB", vram);
  if (app.count("--vram-limit") && !(vram_limit > 0 && vram_limit < 1e6)) fail("--vram-limit {}: expected a positive size in GiB", vram_limit);
  settings.vram_limit_gib = vram_limit;

  // The model's tensor table, without weights.
  std::shared_ptr<const Model> model;
  ModelForMix model_for_mix;
  std::string source = model_path, gguf_name = model_path, prepare;
  if (is_synthetic_spec(model_path)) {
    if (!type_name.empty()) usage_fail("--type is for a config.json; a synthetic model names its mix: synthetic:SHAPE:MIX");
    const SyntheticSpec spec = parse_synthetic_spec(model_path);
    ModelFileOptions options;
    options.layout_only = true;
    model = Model::load(open_model_file(model_path, options));
    model_for_mix = [spec](const std::string& mix) { return layout_model(spec.shape, find_mix(mix), "synthetic"); };
  } else if (is_hf_config(model_path)) {
    if (type_name.empty()) usage_fail("-m {}: a config.json needs --type (the quantization mix, e.g. Q4_K_M)", model_path);
    const QuantMix* mix = find_mix(type_name);
    if (!mix) fail("--type '{}': unknown quantization mix", type_name);
    const ModelShape shape = shape_from_hf_config(model_path);
    model = layout_model(shape, mix, model_path);
    model_for_mix = [shape](const std::string& m) { return layout_model(shape, find_mix(m), "hf"); };
    const std::filesystem::path folder = std::filesystem::is_directory(model_path) ? std::filesystem::path(model_path)
                                                                                    : std::filesystem::path(model_path).parent_path();
    gguf_name = shape.name + "-" + mix->name + ".gguf";
    prepare = fmt::format("roofline convert {} -o {}-f16.gguf && roofline quantize {}-f16.gguf {} {}", folder.empty() ? "." : folder.string(),
                          shape.name, shape.name, gguf_name, mix->name);
  } else {
    if (!type_name.empty()) usage_fail("--type is for a config.json; a GGUF file has its types");
    model = Model::load(gguf::GgufFile::open(model_path));
  }

  if (spec_type == "draft-mtp") settings.mtp_head = Model::mtp_block(model);  // one line when the model has no MTP head
  GpuSpec gpu = resolve_gpu(gpu_name, settings.cuda_context_gib);
  if (app.count("--vram")) gpu.memory_gib = vram;
  if (gpu.host) settings.host_memory_gib = gpu.memory_gib;
  // This machine's card (or CPU): the host's read bandwidth and product rate are measured too (the layers
  // -ngl leaves there).
  if (gpu.measured) {
    const int threads = (int)std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
    settings.host_read_gbs = measure_host_read_bandwidth(threads);
    settings.host_tflops = cpu::measure_cpu_product_tflops(threads);
    if (gpu.host) gpu.peak_gbs = settings.host_read_gbs, gpu.stream_fraction = 1.0, gpu.tflops = settings.host_tflops;
  }
  Plan plan = make_plan(*model, gpu, settings);
  add_recommendations(plan, *model, model_for_mix);
  const PlanSettings& s = plan.settings;

  std::string serve = fmt::format("roofline serve -m {} -c {} -np {}", gguf_name, s.n_ctx, s.n_parallel);
  if (s.type_k != DType::F16 || s.type_v != DType::F16) serve += fmt::format(" -ctk {} -ctv {}", ctk, ctv);
  // With an MTP head, serve hands -ngl to both engines: a count places every unit of the head on the GPU, so a head
  // that -ngl auto places partly (or a target it places partly) keeps auto.
  const bool head_auto = plan.draft_units > 0 && s.n_gpu_layers == EngineOptions::kGpuLayersAuto &&
                         (plan.draft_gpu_units < plan.draft_units || plan.n_gpu_layers < plan.n_units);
  serve += gpu.host ? " -ngl 0"
           : head_auto ? " -ngl auto"
                       : fmt::format(" -ngl {}", plan.n_gpu_layers == plan.n_units ? std::string("all") : std::to_string(plan.n_gpu_layers));
  if (vram_limit > 0) serve += fmt::format(" --vram-limit {}", vram_limit);
  if (no_prompt_cache) serve += " --no-prompt-cache";
  if (f16_copies != "auto") serve += " --f16-copies " + f16_copies;
  if (settings.speculative) serve += " --spec-type " + spec_type;
  if (settings.speculative && draft_max != PlanSettings{}.draft_max) serve += fmt::format(" --draft-max {}", draft_max);
  if (n_batch != 512) serve += fmt::format(" -b {}", n_batch);

  const double weight_bytes = [&] {
    double b = (double)model->token_embd().bytes() + (double)model->output_bytes();
    if (model->tied_embeddings()) b -= (double)model->token_embd().bytes();
    for (int il = 0; il < model->hparams().n_layer; ++il) b += (double)model->layer_bytes(il);
    return b;
  }();
  if (json) {
    ordered_json out;
    out["model"] = {{"source", source}, {"description", model->description()}, {"weight_bytes", weight_bytes},
                    {"n_layer", model->hparams().n_layer}};
    out["gpu"] = {{"name", gpu.name}, {"display_name", gpu.display_name}, {"memory_gib", gpu.memory_gib}, {"peak_gbs", gpu.peak_gbs},
                  {"achievable_gbs", gpu.achievable_gbs()}, {"compute_capability", fmt::format("{}.{}", gpu.cc_major, gpu.cc_minor)},
                  {"tflops", gpu.tflops}, {"measured", gpu.measured}};
    out["settings"] = {{"n_ctx", s.n_ctx}, {"n_parallel", s.n_parallel}, {"cache_type_k", ctk}, {"cache_type_v", ctv},
                       {"n_gpu_layers", ngl}, {"vram_limit_gib", s.vram_limit_gib}, {"n_batch", s.n_batch}};
    out["fits"] = plan.fits;
    out["n_gpu_layers"] = plan.n_gpu_layers;
    out["n_units"] = plan.n_units;
    out["decode_tok_s"] = plan.decode_tok_s;
    out["decode_roofline_tok_s"] = plan.decode_roofline_tok_s;
    out["decode_tok_s_full_context"] = plan.decode_tok_s_full_context;
    out["decode_tok_s_all_slots"] = plan.decode_tok_s_all_slots;
    out["prefill_tok_s"] = plan.prefill_tok_s;
    out["f16_copies"] = {{"bytes", plan.f16_copy_bytes}, {"share_that_fits", plan.f16_copy_share}};
    ordered_json bill = ordered_json::array();
    for (const DeviceBill* b : {&plan.gpu_bill, &plan.host_bill})
      bill.push_back({{"device", b->device}, {"weights_bytes", b->weights}, {"kv_bytes", b->kv}, {"state_bytes", b->state},
                      {"swa_ring_bytes", b->swa}, {"snapshot_bytes", b->snapshots}, {"draft_bytes", b->draft}, {"work_bytes", b->work}, {"context_bytes", b->context}, {"margin_bytes", b->margin}, {"total_bytes", b->total()},
                      {"capacity_bytes", b->capacity}, {"fits", b->fits()}});
    out["bill"] = bill;
    out["kv"] = {{"bytes_per_position", plan.kv_bytes_per_position}, {"bytes_per_slot", plan.kv_bytes_per_slot},
                 {"bytes_total", plan.kv_bytes_total}};
    out["recurrent_state"] = {{"cells", plan.state_cells}, {"bytes_per_cell", plan.state_bytes_per_cell}};
    out["sliding_window"] = {{"ring_positions", plan.kv.swa_ring}, {"rings", plan.swa_ring_cells}, {"bytes_per_ring", plan.swa_bytes_per_ring},
                             {"snapshots", plan.window_snapshots}, {"bytes_per_snapshot", plan.window_snapshot_bytes}};
    out["bytes_per_token"] = {{"gpu", plan.gpu_bytes_per_token}, {"host", plan.host_bytes_per_token}};
    out["derivation"] = plan.derivation;
    out["recommendations"] = plan.recommendations;
    out["serve_command"] = serve;
    if (!prepare.empty()) out["prepare_command"] = prepare;
    std::printf("%s\n", out.dump(1).c_str());
    return 0;
  }

  const HParams& hp = model->hparams();
  std::printf("model:    %s (%s): %d layers + output = %d units, %.2f GiB of weights\n", model->description().c_str(), source.c_str(),
              hp.n_layer, plan.n_units, weight_bytes / kGiB);
  if (gpu.host)
    std::printf("device:   %s, %.1f GiB of RAM, %.1f GB/s %s\n", gpu.measured ? "this machine's CPU" : "host CPU", gpu.memory_gib,
                gpu.peak_gbs, gpu.measured ? "read (measured)" : "peak");
  else
    std::printf("card:     %s (%s, compute capability %d.%d): %.1f GiB, %.0f GB/s %s, %.0f TFLOPS dense FP16%s\n", gpu.name.c_str(),
                gpu.display_name.c_str(), gpu.cc_major, gpu.cc_minor, gpu.memory_gib, gpu.peak_gbs,
                gpu.measured ? "measured" : "peak", gpu.tflops, vram_limit > 0 ? fmt::format(" (--vram-limit {} GiB)", vram_limit).c_str() : "");
  std::printf("settings: -c %d (%d slots x %d positions), K %s, V %s, -ngl %s, -b %d\n\n", s.n_ctx, s.n_parallel, s.n_ctx / s.n_parallel,
              ctk.c_str(), ctv.c_str(), ngl.c_str(), s.n_batch);
  std::printf("%-26s %18s %12s\n", "memory bill", plan.gpu_bill.device.c_str(), "host");
  auto row = [&](const char* label, double g, double h) { std::printf("  %-24s %14.2f GiB %8.2f GiB\n", label, g / kGiB, h / kGiB); };
  row("weights", plan.gpu_bill.weights, plan.host_bill.weights);
  row("KV cache", plan.gpu_bill.kv, plan.host_bill.kv);
  if (plan.state_cells > 0) row("recurrent state", plan.gpu_bill.state, plan.host_bill.state);
  if (plan.swa_ring_cells > 0) row("sliding-window rings", plan.gpu_bill.swa, plan.host_bill.swa);
  if (plan.window_snapshots > 0) row("prompt-cache snapshots", plan.gpu_bill.snapshots, plan.host_bill.snapshots);
  if (plan.draft_units > 0) row("MTP head (draft-mtp)", plan.gpu_bill.draft, plan.host_bill.draft);
  row("compute buffers", plan.gpu_bill.work, plan.host_bill.work);
  row("CUDA context", plan.gpu_bill.context, plan.host_bill.context);
  row("margin kept free", plan.gpu_bill.margin, plan.host_bill.margin);
  row("total", plan.gpu_bill.total(), plan.host_bill.total());
  std::printf("  %-24s %18s %12s\n", "available", plan.gpu_bill.capacity > 0 ? fmt::format("{:.2f} GiB", plan.gpu_bill.capacity / kGiB).c_str() : "-",
              plan.host_bill.capacity > 0 ? fmt::format("{:.2f} GiB", plan.host_bill.capacity / kGiB).c_str() : "not checked");
  if (plan.swa_ring_cells > 0) {
    const int n_sliding = hp.count_sliding_layers(0, hp.n_layer), n_global = hp.count_layers(MixerKind::Attention) - n_sliding;
    const double paged = plan.gpu_bill.kv + plan.host_bill.kv, rings = plan.gpu_bill.swa + plan.host_bill.swa;
    std::printf("KV cache: %.3f GiB = %d global layers x %d positions (%.3f GiB) + %d sliding layers x %d positions (window %d + a "
                "step's %d - 1, in blocks of %d) x %d rings (%.3f GiB)\n",
                plan.kv_bytes_total / kGiB, n_global, plan.kv.n_blocks * plan.kv.block_size, paged / kGiB, n_sliding, plan.kv.swa_ring,
                hp.sliding_window, s.n_batch, plan.kv.block_size, plan.swa_ring_cells, rings / kGiB);
    if (plan.window_snapshots > 0)
      std::printf("prompt-cache snapshots: %d x %.1f MiB (%d sliding layers x the %d positions before a block boundary) in host "
                  "memory, %.3f GiB (--cache-ram %.0f MiB)\n",
                  plan.window_snapshots, plan.window_snapshot_bytes / 1048576.0, n_sliding, plan.kv.swa_snapshot_blocks * plan.kv.block_size,
                  plan.host_bill.snapshots / kGiB, s.cache_ram_mib);
  } else {
    std::printf("KV cache: %.1f KiB per position (%d attention layers), %.3f GiB per slot, %.3f GiB for -c %d\n",
                plan.kv_bytes_per_position / 1024, hp.count_layers(MixerKind::Attention), plan.kv_bytes_per_slot / kGiB,
                plan.kv_bytes_total / kGiB, s.n_ctx);
  }
  if (plan.state_cells > 0)
    std::printf("recurrent state: %d cells (%d slots + %d prompt-cache snapshots%s) x %.1f MiB\n", plan.state_cells, s.n_parallel,
                plan.state_cells - s.n_parallel * (s.speculative ? 2 : 1),
                s.speculative ? fmt::format(" + {} kept for rejected drafts", s.n_parallel).c_str() : "", plan.state_bytes_per_cell / 1048576.0);
  if (plan.draft_units > 0)
    std::printf("MTP head: an engine of its own, %d/%d units on the GPU: %.2f GiB of weights (its layer; on the GPU its own "
                "copies of the embedding and the output matrix), %.3f GiB of KV (%d positions: the slots' and %d drafts each)%s\n",
                plan.draft_gpu_units, plan.draft_units, plan.draft_weights / kGiB, plan.draft_kv / kGiB, plan.draft_positions,
                s.draft_max, plan.draft_work > 0 ? fmt::format(", {:.2f} GiB of compute buffers", plan.draft_work / kGiB).c_str() : "");
  if (gpu.host)
    std::printf("\n%s: all %d units on the host\n", plan.fits ? "FITS" : "DOES NOT FIT", plan.n_units);
  else
    std::printf("\n%s: %d/%d units on the GPU\n", plan.fits ? "FITS" : "DOES NOT FIT", plan.n_gpu_layers, plan.n_units);
  std::printf("predicted: decode %.1f tok/s (roofline %.1f)%s, prefill %.0f tok/s\n", plan.decode_tok_s, plan.decode_roofline_tok_s,
              s.n_parallel > 1 && plan.decode_tok_s_all_slots > 0 ? fmt::format("; {:.1f} tok/s in all with the {} slots generating", plan.decode_tok_s_all_slots,
                                                          s.n_parallel).c_str()
                                            : "",
              plan.prefill_tok_s);
  std::printf("derivation:\n");
  for (const std::string& line : plan.derivation) std::printf("  %s\n", line.c_str());
  if (!plan.recommendations.empty()) {
    std::printf("recommendations:\n");
    for (const std::string& line : plan.recommendations) std::printf("  %s\n", line.c_str());
  }
  std::printf("command:\n");
  if (!prepare.empty()) std::printf("  %s\n", prepare.c_str());
  std::printf("  %s\n", serve.c_str());
  return 0;
}

int run_plan(int argc, char** argv) { return run_guarded(run, argc, argv); }
const CommandRegistration registration{"plan", "what a model will do on a card: memory bill, GPU layers, predicted speed", run_plan, 25};

}  // namespace
}  // namespace roofline::cli
