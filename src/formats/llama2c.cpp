// llama2.c legacy checkpoint reader: header checks (positive sizes, heads dividing dim, an even head
// size), the section table in file order, and an exact file-size check so a truncated or padded file,
// or one of llama2.c's later export versions, is refused with a clear message.
#include "formats/llama2c.h"

#include <cstring>

#include "core/error.h"

namespace roofline::llama2c {
namespace {

struct Layout {
  std::string kind;
  std::vector<int64_t> shape;  // one layer's slice, or the whole array
  bool per_layer;
};

std::vector<Layout> layout(const Config& c) {
  const int64_t d = c.dim, h = c.hidden_dim, v = c.vocab_size, kv = c.kv_dim(), hs = c.head_size();
  std::vector<Layout> l = {
      {"tok_embeddings", {v, d}, false}, {"rms_att", {d}, true},      {"wq", {d, d}, true},
      {"wk", {kv, d}, true},             {"wv", {kv, d}, true},       {"wo", {d, d}, true},
      {"rms_ffn", {d}, true},            {"w1", {h, d}, true},        {"w2", {d, h}, true},
      {"w3", {h, d}, true},              {"rms_final", {d}, false},   {"freq_cis_real", {c.seq_len, hs / 2}, false},
      {"freq_cis_imag", {c.seq_len, hs / 2}, false},
  };
  if (!c.shared_classifier) l.push_back({"wcls", {v, d}, false});
  return l;
}

int64_t product(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t x : s) n *= x;
  return n;
}

}  // namespace

int64_t Array::n_elements() const { return product(shape); }

uint64_t Checkpoint::expected_size(const Config& c) {
  uint64_t floats = 0;
  for (const auto& s : layout(c)) floats += (uint64_t)product(s.shape) * (s.per_layer ? (uint64_t)c.n_layers : 1);
  return 28 + floats * 4;
}

std::shared_ptr<Checkpoint> Checkpoint::open(const std::string& path) {
  auto ck = std::shared_ptr<Checkpoint>(new Checkpoint());
  ck->path_ = path;
  ck->map_ = std::make_unique<MappedFile>(path);
  const uint8_t* p = ck->map_->data();
  const size_t size = ck->map_->size();
  if (size < 28) fail("{}: not a llama2.c checkpoint ({} bytes, shorter than its 28-byte header)", path, size);
  int32_t h[7];
  std::memcpy(h, p, 28);
  uint32_t magic;
  std::memcpy(&magic, p, 4);
  if (magic == 0x616b3432u) {  // "ak42": llama2.c's export versions 1 and 2
    int32_t version;
    std::memcpy(&version, p + 4, 4);
    fail("{}: a llama2.c version {} export; only the legacy version 0 format (export.py --version 0) is supported", path,
         version);
  }
  const char* names[7] = {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"};
  for (int i = 0; i < 7; ++i) {
    const int64_t v = i == 5 ? std::abs((int64_t)h[i]) : h[i];
    const int64_t limit = i == 2 ? 1024 : (i == 5 ? (1 << 22) : (1 << 20));
    if (v <= 0 || v > limit)
      fail("{}: not a llama2.c checkpoint: header {} = {} is out of range (header: {} {} {} {} {} {} {})", path, names[i], h[i],
           h[0], h[1], h[2], h[3], h[4], h[5], h[6]);
  }
  Config& c = ck->config_;
  c.dim = h[0];
  c.hidden_dim = h[1];
  c.n_layers = h[2];
  c.n_heads = h[3];
  c.n_kv_heads = h[4];
  c.vocab_size = std::abs(h[5]);
  c.shared_classifier = h[5] > 0;
  c.seq_len = h[6];
  if (c.dim % c.n_heads != 0) fail("{}: not a llama2.c checkpoint: dim {} is not a multiple of n_heads {}", path, c.dim, c.n_heads);
  if (c.n_kv_heads > c.n_heads || c.n_heads % c.n_kv_heads != 0)
    fail("{}: not a llama2.c checkpoint: n_heads {} is not a multiple of n_kv_heads {}", path, c.n_heads, c.n_kv_heads);
  if (c.head_size() % 2 != 0) fail("{}: not a llama2.c checkpoint: head size {} is odd", path, c.head_size());
  const uint64_t want = expected_size(c);
  if (size != want) {
    Config other = c;
    other.shared_classifier = !c.shared_classifier;
    const bool flipped = size == expected_size(other);
    fail("{}: {} bytes, but a llama2.c checkpoint with this header (dim {}, hidden {}, {} layers, {}/{} heads, vocab {}, "
         "seq_len {}, {} classifier) has {} bytes{}",
         path, size, c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, c.seq_len,
         c.shared_classifier ? "shared" : "separate", want,
         flipped ? " (the size fits the other classifier setting: is the sign of vocab_size wrong?)"
                 : (size < want ? " (truncated?)" : ""));
  }
  uint64_t offset = 28;
  for (const auto& s : layout(c)) {
    ck->sections_.push_back({s.kind, s.shape, s.per_layer, offset});
    offset += (uint64_t)product(s.shape) * (s.per_layer ? c.n_layers : 1) * 4;
  }
  return ck;
}

const Checkpoint::Section& Checkpoint::section(const std::string& kind) const {
  for (const auto& s : sections_)
    if (s.kind == kind) return s;
  fail("llama2.c checkpoint has no array '{}'", kind);
}

Array Checkpoint::tok_embeddings() const {
  const Section& s = section("tok_embeddings");
  return {s.per_layer_shape, map_->data() + s.offset};
}

Array Checkpoint::rms_final() const {
  const Section& s = section("rms_final");
  return {s.per_layer_shape, map_->data() + s.offset};
}

Array Checkpoint::classifier() const {
  if (config_.shared_classifier) return tok_embeddings();
  const Section& s = section("wcls");
  return {s.per_layer_shape, map_->data() + s.offset};
}

Array Checkpoint::layer(const std::string& kind, int il) const {
  const Section& s = section(kind);
  if (!s.per_layer || il < 0 || il >= config_.n_layers) fail("llama2.c checkpoint: no per-layer array {}[{}]", kind, il);
  return {s.per_layer_shape, map_->data() + s.offset + (uint64_t)il * product(s.per_layer_shape) * 4};
}

}  // namespace roofline::llama2c
