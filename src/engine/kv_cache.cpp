// KvCache bookkeeping: block allocation with reference counts, sequence growth, forking and truncation.
#include "engine/kv_cache.h"

#include "core/error.h"

namespace roofline {

KvCache::KvCache(int n_blocks, int block_size) : block_size_(block_size), refs_(n_blocks, 0) {
  if (n_blocks <= 0 || block_size <= 0) fail("KV cache needs at least one block of at least one position");
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
  ROOFLINE_CHECK(!free_.empty());
  const int b = free_.back();
  free_.pop_back();
  refs_[b] = 1;
  return b;
}

void KvCache::release_block(int block) {
  ROOFLINE_CHECK(refs_[block] > 0, "block {} released twice", block);
  if (--refs_[block] == 0) free_.push_back(block);
}

int KvCache::create_sequence() {
  const int id = next_seq_++;
  seqs_.emplace(id, Sequence{});
  return id;
}

void KvCache::free_sequence(int seq) {
  Sequence& s = get(seq);
  for (int32_t b : s.blocks) release_block(b);
  seqs_.erase(seq);
}

KvCache::Fork KvCache::fork_sequence(int seq) {
  const Sequence src = get(seq);  // copy: the map may rehash below
  const int full = src.length / block_size_;
  const bool partial = src.length % block_size_ != 0;
  if (partial && free_.empty()) fail("no free KV block to fork sequence {}", seq);
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
  if (need > (int)free_.size()) return false;
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
