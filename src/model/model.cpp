// Model loading: hyperparameters from metadata (read_hparams) and tensor binding by the
// architecture's tensor table with shape checks; all problems are collected and reported in one Error.
#include "model/model.h"

#include <cmath>
#include <map>
#include <set>

#include "core/error.h"
#include "model/quant_mix.h"

namespace roofline {

std::shared_ptr<const Model> Model::load(std::shared_ptr<const gguf::GgufFile> file) {
  auto model = std::shared_ptr<Model>(new Model());
  model->file_ = file;
  const gguf::Metadata& md = file->metadata();
  const std::string& name = file->name();
  try {
    const std::string arch = md.get_string("general.architecture");
    model->arch_ = find_arch(arch);
    if (!model->arch_) fail("architecture '{}' is not supported (supported: {})", arch, supported_arch_names());
    model->hparams_ = read_hparams(md, *model->arch_);
  } catch (const Error& e) {
    fail("{}: {}", name, e.what());
  }

  const HParams& hp = model->hparams_;
  std::map<std::string, const gguf::TensorInfo*, std::less<>> tensors;
  for (const auto& t : file->tensors()) tensors.emplace(t.name, &t);
  std::set<std::string, std::less<>> used;
  std::vector<std::string> problems;

  auto bind = [&](const std::string& tname, std::vector<int64_t> shape, bool required) -> Weight {
    auto it = tensors.find(tname);
    if (it == tensors.end()) {
      if (required) problems.push_back("missing " + tname);
      return {};
    }
    used.insert(tname);
    const gguf::TensorInfo* t = it->second;
    bool ok = t->n_dims <= (int)std::max<size_t>(shape.size(), 1);
    for (size_t i = 0; i < 4; ++i) ok = ok && t->ne[i] == (i < shape.size() ? shape[i] : 1);
    if (!ok) {
      std::string want = "[";
      for (size_t i = 0; i < shape.size(); ++i) want += (i ? ", " : "") + std::to_string(shape[i]);
      problems.push_back(fmt::format("{} has shape {}, expected {}]", tname, t->shape_string(), want));
    }
    if (!dtype_has_reference(t->type))
      problems.push_back(fmt::format("{} has type {}, which roofline does not support", tname, dtype_name(t->type)));
    return Weight{t};
  };

  const int64_t n_vocab = tensors.count("token_embd.weight") ? tensors.find("token_embd.weight")->second->ne[1] : 0;
  model->hparams_.n_vocab = (int)n_vocab;
  model->token_embd_ = bind("token_embd.weight", {hp.n_embd, n_vocab}, true);
  model->output_norm_ = bind("output_norm.weight", {hp.n_embd}, true);
  model->output_ = bind("output.weight", {hp.n_embd, n_vocab}, false);
  if (!model->output_) {
    model->output_ = model->token_embd_;
    model->tied_ = true;
  }
  model->rope_freqs_ = bind("rope_freqs.weight", {hp.n_rot / 2}, false);
  if (model->rope_freqs_ && model->rope_freqs_.type() != DType::F32) problems.push_back("rope_freqs.weight must be F32");

  const ArchInfo& arch = *model->arch_;
  model->layers_.resize(hp.n_layer);
  for (int il = 0; il < hp.n_layer; ++il) {
    LayerWeights& L = model->layers_[il];
    L.mixer = hp.mixer(il);
    for (const PlannedTensor& t : layer_tensor_plan(arch, hp, il)) L[t.rule->role] = bind(t.name, t.shape, t.rule->required);
  }
  // MTP blocks after the main stack: whatever tensors they hold are kept (for a drafter), never checked
  // against the main stack's table, so files that carry them always load.
  for (int il = hp.n_layer; il < hp.n_layer + hp.n_layer_nextn; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    for (const auto& [tname, t] : tensors)
      if (tname.rfind(p, 0) == 0 && !used.count(tname)) {
        used.insert(tname);
        model->nextn_.push_back(Weight{t});
      }
  }
  for (const auto& [tname, t] : tensors)
    if (!used.count(tname)) problems.push_back("unexpected tensor " + tname);
  if (!problems.empty()) {
    std::string list;
    const size_t shown = std::min<size_t>(problems.size(), 8);
    for (size_t i = 0; i < shown; ++i) list += (i ? "; " : "") + problems[i];
    if (problems.size() > shown) list += fmt::format("; and {} more", problems.size() - shown);
    fail("{}: not a valid {} model: {}", name, hp.arch, list);
  }
  return model;
}

Weight Model::nextn_tensor(const std::string& suffix) const {
  const std::string name = "blk." + std::to_string(hparams_.n_layer) + "." + suffix;
  for (const Weight& w : nextn_)
    if (w.tensor->name == name) return w;
  return {};
}

std::shared_ptr<const Model> Model::mtp_block(const std::shared_ptr<const Model>& target) {
  const HParams& thp = target->hparams_;
  const std::string& name = target->file_->name();
  if (thp.n_layer_nextn < 1)
    fail("{}: the model has no MTP block ({}.nextn_predict_layers is 0): MTP drafting needs a file converted with it", name, thp.arch);
  auto m = std::shared_ptr<Model>(new Model());
  m->file_ = target->file_;
  m->arch_ = target->arch_;
  HParams& hp = m->hparams_;
  hp = thp;
  hp.n_layer = 1;
  hp.n_layer_nextn = 0;
  hp.layer_mixer = {MixerKind::Attention};
  hp.layer_sliding.clear();
  m->token_embd_ = target->token_embd_;
  m->output_ = target->output_;
  m->tied_ = target->tied_;
  m->rope_freqs_ = target->rope_freqs_;
  std::vector<std::string> problems;
  auto bind = [&](const std::string& suffix, const std::vector<int64_t>& shape, bool required) -> Weight {
    const Weight w = target->nextn_tensor(suffix);
    const std::string tname = "blk." + std::to_string(thp.n_layer) + "." + suffix;
    if (!w) {
      if (required) problems.push_back("missing " + tname);
      return {};
    }
    bool ok = true;
    for (size_t i = 0; i < 4; ++i) ok = ok && w.tensor->ne[i] == (i < shape.size() ? shape[i] : 1);
    if (!ok) problems.push_back(fmt::format("{} has shape {}", tname, w.tensor->shape_string()));
    return w;
  };
  m->layers_.resize(1);
  m->layers_[0].mixer = MixerKind::Attention;
  for (const PlannedTensor& t : layer_tensor_plan(*m->arch_, hp, 0))
    m->layers_[0][t.rule->role] = bind(t.name.substr(t.name.find('.', 4) + 1), t.shape, t.rule->required);
  m->output_norm_ = bind("nextn.shared_head_norm.weight", {hp.n_embd}, true);
  bind("nextn.eh_proj.weight", {2 * (int64_t)hp.n_embd, hp.n_embd}, true);
  bind("nextn.enorm.weight", {hp.n_embd}, true);
  bind("nextn.hnorm.weight", {hp.n_embd}, true);
  if (!problems.empty()) {
    std::string list;
    for (size_t i = 0; i < problems.size() && i < 6; ++i) list += (i ? "; " : "") + problems[i];
    fail("{}: the MTP block is incomplete: {}", name, list);
  }
  return m;
}

uint64_t Model::layer_bytes(int i) const {
  uint64_t n = 0;
  for (const Weight& w : layers_[i].tensors)
    if (w) n += w.bytes();
  return n;
}

uint64_t Model::output_bytes() const { return output_norm_.bytes() + output_.bytes(); }

uint64_t Model::n_params() const {
  uint64_t n = 0;
  for (const auto& t : file_->tensors()) n += (uint64_t)t.n_elements();
  return n;
}

std::string Model::description() const {
  const double p = (double)n_params();
  std::string size = p >= 1e9 ? fmt::format("{:.1f}B", p / 1e9) : fmt::format("{:.0f}M", p / 1e6);
  const int64_t ft = metadata().get_int_or("general.file_type", -1);
  return fmt::format("{} {} {}", hparams_.arch, size, ft >= 0 ? file_type_description((uint32_t)ft) : "unknown type");
}

}  // namespace roofline
