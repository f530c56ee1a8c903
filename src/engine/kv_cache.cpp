// KvCache bookkeeping: block allocation with reference counts, sequence growth, forking and truncation,
// and the prefix index of full blocks that prompt caching adopts from (evicted least recently used first).
#include "engine/kv_cache.h"

#include <algorithm>

#include "core/error.h"

namespace roofline {

KvCache::KvCache(int n_blocks, int block_size) : block_size_(block_size), refs_(std::max(n_blocks, 0), 0) {
  if (n_blocks <= 0 || block_size <= 0) fail("KV cache needs at least one block of at least one position");
  block_hash_.assign(n_blocks, 0);
  block_tokens_.resize(n_blocks);
  lru_pos_.resize(n_blocks);
  in_lru_.assign(n_blocks, 0);
  free_.reserve(n_blocks);
  for (int b = n_blocks - 1; b >= 0; --b) free_.push_back(b);  // hand out low ids first
}

const KvCache::Sequence& KvCache::get(int seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) fail("unknown sequence {}", seq);
  return it->second;
}
KvCache::Sequence& KvCache::get(int seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) fail("unknown sequence {}", seq);
  return it->second;
}

int KvCache::allocate_block() {
  if (free_.empty()) {  // evict the least recently used cached block
    ROOFLINE_CHECK(!lru_.empty());
    const int32_t victim = lru_.front();
    unindex_block(victim);
  }
  ROOFLINE_CHECK(!free_.empty());
  const int b = free_.back();
  free_.pop_back();
  refs_[b] = 1;
  return b;
}

void KvCache::release_block(int block) {
  ROOFLINE_CHECK(refs_[block] > 0, "block {} released twice", block);
  if (--refs_[block] > 0) return;
  if (block_hash_[block] != 0) {  // stays cached until the pool needs it
    lru_pos_[block] = lru_.insert(lru_.end(), block);
    in_lru_[block] = 1;
  } else {
    free_.push_back(block);
  }
}

void KvCache::unindex_block(int block) {
  auto it = index_.find(block_hash_[block]);
  if (it != index_.end() && it->second == block) index_.erase(it);
  block_hash_[block] = 0;
  block_tokens_[block].clear();
  if (in_lru_[block]) {
    lru_.erase(lru_pos_[block]);
    in_lru_[block] = 0;
    free_.push_back(block);
  }
}

uint64_t KvCache::chain_hash(uint64_t parent, std::span<const int32_t> block_tokens) const {
  // splitmix64-style mixing of the parent hash and every token id; 0 is reserved for "not indexed".
  auto mix = [](uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
  };
  uint64_t h = mix(parent ^ 0x5851F42D4C957F2Dull);
  for (int32_t t : block_tokens) h = mix(h ^ (uint64_t)(uint32_t)t);
  return h ? h : 1;
}

void KvCache::cache_blocks(int seq, std::span<const int32_t> tokens) {
  const Sequence& s = get(seq);
  const size_t n = std::min(tokens.size(), (size_t)s.length);
  const size_t full = n / (size_t)block_size_;
  uint64_t h = 0;
  for (size_t i = 0; i < full; ++i) {
    const auto block = tokens.subspan(i * block_size_, block_size_);
    h = chain_hash(h, block);
    const int32_t b = s.blocks[i];
    if (block_hash_[b] != 0 || index_.count(h)) continue;
    index_.emplace(h, b);
    block_hash_[b] = h;
    block_tokens_[b].assign(block.begin(), block.end());
  }
}

int KvCache::match_prefix(std::span<const int32_t> tokens, int max_blocks, int* unreferenced) const {
  const std::vector<int32_t> blocks = matched_blocks(tokens, max_blocks);
  if (unreferenced) {
    *unreferenced = 0;
    for (int32_t b : blocks) *unreferenced += refs_[b] == 0 ? 1 : 0;
  }
  return (int)blocks.size();
}

std::vector<int32_t> KvCache::matched_blocks(std::span<const int32_t> tokens, int max_blocks) const {
  std::vector<int32_t> out;
  uint64_t h = 0;
  for (size_t i = 0; (int)i < max_blocks && (i + 1) * block_size_ <= tokens.size(); ++i) {
    const auto block = tokens.subspan(i * block_size_, block_size_);
    h = chain_hash(h, block);
    auto it = index_.find(h);
    if (it == index_.end()) break;
    const auto& stored = block_tokens_[it->second];
    if (!std::equal(stored.begin(), stored.end(), block.begin(), block.end())) break;
    out.push_back(it->second);
  }
  return out;
}

int KvCache::adopt_prefix(int seq, std::span<const int32_t> tokens, int max_blocks) {
  Sequence& s = get(seq);
  if (s.length != 0 || !s.blocks.empty()) fail("sequence {} must be empty to adopt a cached prefix", seq);
  const int n = match_prefix(tokens, max_blocks);
  uint64_t h = 0;
  for (int i = 0; i < n; ++i) {
    h = chain_hash(h, tokens.subspan((size_t)i * block_size_, block_size_));
    const int32_t b = index_.at(h);
    if (in_lru_[b]) {
      lru_.erase(lru_pos_[b]);
      in_lru_[b] = 0;
    }
    ++refs_[b];
    s.blocks.push_back(b);
  }
  s.length = n * block_size_;
  return s.length;
}

void KvCache::clear_prefix_cache() {
  std::vector<int32_t> blocks;
  for (const auto& [h, b] : index_) blocks.push_back(b);
  for (int32_t b : blocks) unindex_block(b);
}

int KvCache::create_sequence() {
  const int id = next_seq_++;
  seqs_.emplace(id, Sequence{});
  return id;
}

void KvCache::free_sequence(int seq) {
  Sequence& s = get(seq);
  // Last block first: cached blocks of a prefix are then evicted from the end of the chain first.
  for (auto it = s.blocks.rbegin(); it != s.blocks.rend(); ++it) release_block(*it);
  seqs_.erase(seq);
}

KvCache::Fork KvCache::fork_sequence(int seq) {
  const Sequence src = get(seq);  // copy: the map may rehash below
  const int full = src.length / block_size_;
  const bool partial = src.length % block_size_ != 0;
  if (partial && free_blocks() == 0) fail("no free KV block to fork sequence {}", seq);
  const int id = next_seq_++;
  Sequence dst;
  dst.length = src.length;
  for (int i = 0; i < full; ++i) {
    dst.blocks.push_back(src.blocks[i]);
    ++refs_[src.blocks[i]];
  }
  Fork fork{id, -1, -1};
  if (partial) {
    const int b = allocate_block();
    dst.blocks.push_back(b);
    fork.copy_src = src.blocks[full];
    fork.copy_dst = b;
  }
  seqs_.emplace(id, std::move(dst));
  return fork;
}

int KvCache::truncate(int seq, int length) {
  Sequence& s = get(seq);
  if (length < 0 || length > s.length) fail("cannot truncate sequence {} of length {} to {}", seq, s.length, length);
  const size_t keep = (size_t)((length + block_size_ - 1) / block_size_);
  while (s.blocks.size() > keep) {
    release_block(s.blocks.back());
    s.blocks.pop_back();
  }
  s.length = length;
  // A sequence must own the block it writes next. If the cut lands inside a shared block, drop that
  // block too: the caller re-evaluates from the returned (block-aligned) length.
  if (length % block_size_ != 0 && refs_[s.blocks.back()] > 1) {
    release_block(s.blocks.back());
    s.blocks.pop_back();
    s.length = (int)s.blocks.size() * block_size_;
  } else if (length % block_size_ != 0 && block_hash_[s.blocks.back()] != 0) {
    unindex_block(s.blocks.back());  // it will be written again: its cached content no longer holds
  }
  return s.length;
}

int KvCache::length(int seq) const { return get(seq).length; }
const std::vector<int32_t>& KvCache::block_table(int seq) const { return get(seq).blocks; }

int KvCache::blocks_needed(int seq, int n_new) const {
  const Sequence& s = get(seq);
  const int have = (int)s.blocks.size();
  const int want = (s.length + n_new + block_size_ - 1) / block_size_;
  return want > have ? want - have : 0;
}

bool KvCache::reserve(int seq, int n_new) {
  const int need = blocks_needed(seq, n_new);
  if (need > free_blocks()) return false;
  Sequence& s = get(seq);
  for (int i = 0; i < need; ++i) s.blocks.push_back(allocate_block());
  return true;
}

void KvCache::commit(int seq, int n_new) {
  Sequence& s = get(seq);
  ROOFLINE_CHECK((int64_t)(s.length + n_new) <= (int64_t)s.blocks.size() * block_size_);
  s.length += n_new;
}

}  // namespace roofline
