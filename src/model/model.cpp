// Model loading: hyperparameters from metadata (read_hparams) and tensor binding by the
// architecture's tensor table with shape checks; all problems are collected and reported in one Error.
#include "model/model.h"

#include <cmath>
#include <cstring>
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

std::shared_ptr<const Model> Model::tensor_slice(const std::shared_ptr<const Model>& target, int kv_head_begin, int kv_head_end,
                                                 int64_t ff_begin, int64_t ff_end) {
  const HParams& thp = target->hparams_;
  require_tensor_splittable(thp);
  if (kv_head_begin < 0 || kv_head_end > thp.n_head_kv || kv_head_begin >= kv_head_end || ff_begin < 0 || ff_end > thp.n_ff ||
      ff_begin >= ff_end)
    fail("-sm row: KV heads [{}, {}) of {} and FFN features [{}, {}) of {} are not a slice of the model", kv_head_begin, kv_head_end,
         thp.n_head_kv, ff_begin, ff_end, thp.n_ff);
  auto m = std::shared_ptr<Model>(new Model());
  m->file_ = target->file_;
  m->arch_ = target->arch_;
  m->hparams_ = thp;
  m->token_embd_ = target->token_embd_;
  m->output_norm_ = target->output_norm_;
  m->output_ = target->output_;
  m->rope_freqs_ = target->rope_freqs_;
  m->tied_ = target->tied_;
  m->layers_ = target->layers_;
  m->nextn_ = target->nextn_;
  m->parent_ = target;  // its weights (and any slices of its own) stay alive
  HParams& hp = m->hparams_;
  const int gqa = thp.n_gqa();
  hp.n_head_kv = kv_head_end - kv_head_begin;
  hp.n_head = hp.n_head_kv * gqa;
  hp.n_ff = (int)(ff_end - ff_begin);
  Model& mm = *m;
  auto own = [&](const gguf::TensorInfo& from, int64_t row_length, int64_t rows, const uint8_t* data, size_t n_bytes) {
    auto info = std::make_unique<gguf::TensorInfo>(from);
    info->name = fmt::format("{} (slice)", from.name);
    info->ne = {row_length, rows, 1, 1};
    info->n_dims = from.n_dims;
    info->data = data;
    info->n_bytes = n_bytes;
    mm.owned_infos_.push_back(std::move(info));
    return Weight{mm.owned_infos_.back().get()};
  };
  // Rows [r0, r1) of a matrix, or elements [r0, r1) of a vector: a view of the target's bytes.
  auto rows = [&](const Weight& w, int64_t r0, int64_t r1) -> Weight {
    if (!w) return w;
    if (w.tensor->n_dims == 1) {
      const size_t element = dtype_row_bytes(w.type(), dtype_block_size(w.type())) / dtype_block_size(w.type());
      if (r0 % dtype_block_size(w.type()) || r1 % dtype_block_size(w.type()))
        fail("-sm row: {} cannot be cut at element {}", w.tensor->name, r0);
      return own(*w.tensor, r1 - r0, 1, w.data() ? w.data() + r0 * element : nullptr, (size_t)(r1 - r0) * element);
    }
    if (w.rows() < r1) fail("internal error: rows [{}, {}) of {} ({} rows)", r0, r1, w.tensor->name, w.rows());
    const size_t row_bytes = dtype_row_bytes(w.type(), w.cols());
    return own(*w.tensor, w.cols(), r1 - r0, w.data() ? w.data() + (size_t)r0 * row_bytes : nullptr, (size_t)(r1 - r0) * row_bytes);
  };
  // Columns [c0, c1) of a matrix: copied.
  auto cols = [&](const Weight& w, int64_t c0, int64_t c1) -> Weight {
    if (!w) return w;
    const int64_t block = dtype_block_size(w.type());
    if (c0 % block || c1 % block)
      fail("-sm row: columns [{}, {}) of {} are not whole {} blocks of {}", c0, c1, w.tensor->name, dtype_name(w.type()), block);
    const size_t out_bytes = (size_t)w.rows() * dtype_row_bytes(w.type(), c1 - c0);
    if (!w.data()) return own(*w.tensor, c1 - c0, w.rows(), nullptr, out_bytes);
    mm.owned_bytes_.push_back(slice_columns(w.data(), w.type(), w.rows(), w.cols(), c0, c1));
    return own(*w.tensor, c1 - c0, w.rows(), mm.owned_bytes_.back().data(), out_bytes);
  };
  using LT = LayerTensor;
  const int64_t q0 = (int64_t)kv_head_begin * gqa * thp.head_dim_k, q1 = (int64_t)kv_head_end * gqa * thp.head_dim_k;
  const int64_t k0 = (int64_t)kv_head_begin * thp.head_dim_k, k1 = (int64_t)kv_head_end * thp.head_dim_k;
  const int64_t v0 = (int64_t)kv_head_begin * thp.head_dim_v, v1 = (int64_t)kv_head_end * thp.head_dim_v;
  const int64_t o0 = (int64_t)kv_head_begin * gqa * thp.head_dim_v, o1 = (int64_t)kv_head_end * gqa * thp.head_dim_v;
  for (LayerWeights& L : m->layers_) {
    L[LT::AttnQ] = rows(L[LT::AttnQ], q0, q1);
    L[LT::AttnQBias] = rows(L[LT::AttnQBias], q0, q1);
    L[LT::AttnK] = rows(L[LT::AttnK], k0, k1);
    L[LT::AttnKBias] = rows(L[LT::AttnKBias], k0, k1);
    L[LT::AttnV] = rows(L[LT::AttnV], v0, v1);
    L[LT::AttnVBias] = rows(L[LT::AttnVBias], v0, v1);
    L[LT::AttnOut] = cols(L[LT::AttnOut], o0, o1);
    L[LT::FfnGate] = rows(L[LT::FfnGate], ff_begin, ff_end);
    L[LT::FfnUp] = rows(L[LT::FfnUp], ff_begin, ff_end);
    L[LT::FfnDown] = cols(L[LT::FfnDown], ff_begin, ff_end);
  }
  return m;
}

void require_tensor_splittable(const HParams& hp) {
  if (hp.is_moe()) fail("-sm row does not split mixture-of-experts layers yet; use -sm layer");
  for (int il = 0; il < hp.n_layer; ++il)
    if (!hp.has_kv(il)) fail("-sm row does not split {} layers (layer {}) yet; use -sm layer", mixer_kind_name(hp.mixer(il)), il);
  if (hp.attn_output_gate) fail("-sm row does not split gated attention yet; use -sm layer");
}

std::vector<uint8_t> slice_columns(const uint8_t* data, DType type, int64_t rows, int64_t cols, int64_t col_begin, int64_t col_end) {
  const int64_t block = dtype_block_size(type);
  if (col_begin < 0 || col_end > cols || col_begin >= col_end || col_begin % block != 0 || col_end % block != 0 || cols % block != 0)
    fail("internal error: columns [{}, {}) of {} are not whole {} blocks", col_begin, col_end, cols, dtype_name(type));
  const size_t row_bytes = dtype_row_bytes(type, cols), offset = dtype_row_bytes(type, col_begin),
               out_row = dtype_row_bytes(type, col_end - col_begin);
  std::vector<uint8_t> out((size_t)rows * out_row);
  for (int64_t r = 0; r < rows; ++r) std::memcpy(out.data() + (size_t)r * out_row, data + (size_t)r * row_bytes + offset, out_row);
  return out;
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
