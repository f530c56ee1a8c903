// SequenceMemory: the KV cache's bookkeeping plus state cells for recurrent layers, and the
// snapshots that let prompt caching reuse a prefix on such models.
#include "engine/sequence_memory.h"

#include <algorithm>
#include <climits>

#include "core/error.h"

namespace roofline {

void SequenceMemory::Device::save_window(int, int, int, int) {
  fail("internal error: this memory keeps no sliding-window snapshots");
}
void SequenceMemory::Device::load_window(int, int, int, int) {
  fail("internal error: this memory keeps no sliding-window snapshots");
}

SequenceMemory::SequenceMemory(const Options& options, Device* device)
    : options_(options), device_(device), kv_(options.n_blocks, options.block_size) {
  if (options.recurrent) {
    if (options.n_seq_max < 1) fail("a model with recurrent layers needs room for at least one sequence");
    if (options.n_snapshots < 0) fail("the number of state snapshots cannot be negative");
    for (int c = options.n_seq_max - 1; c >= 0; --c) free_cells_.push_back(c);
    backup_base_ = options.n_seq_max + (options.windowed ? 0 : options.n_snapshots);
    if (options.windowed) {  // host window snapshots, numbered from 0
      if (options.ring < options.block_size || options.ring % options.block_size || options.window < 1)
        fail("internal error: sliding-window ring {} (window {}, blocks of {})", options.ring, options.window, options.block_size);
      for (int c = options.n_snapshots - 1; c >= 0; --c) free_snap_cells_.push_back(c);
    } else {
      for (int c = options.n_seq_max + options.n_snapshots - 1; c >= options.n_seq_max; --c) free_snap_cells_.push_back(c);
    }
  } else if (options.windowed) {
    fail("internal error: a windowed memory must be recurrent (its rings cannot be cut back)");
  }
}

int SequenceMemory::free_sequences() const { return options_.recurrent ? (int)free_cells_.size() : INT_MAX; }

int SequenceMemory::n_state_snapshots() const {
  return options_.recurrent ? options_.n_snapshots - (int)free_snap_cells_.size() : 0;
}

int SequenceMemory::create_sequence(bool snapshots) {
  SeqState st;
  st.snapshots = snapshots;
  if (options_.recurrent) {
    if (free_cells_.empty())
      fail("all {} sequence states are in use (this model keeps a recurrent state per sequence; allow more parallel "
           "sequences)", options_.n_seq_max);
    st.cell = free_cells_.back();
    free_cells_.pop_back();
  }
  const int seq = kv_.create_sequence();
  seqs_.emplace(seq, st);
  return seq;
}

void SequenceMemory::free_sequence(int seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) fail("unknown sequence {}", seq);
  kv_.free_sequence(seq);
  if (it->second.cell >= 0) free_cells_.push_back(it->second.cell);
  if (it->second.snap >= 0) free_snap_cells_.push_back(it->second.snap);
  seqs_.erase(it);
}

int SequenceMemory::fork_sequence(int seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) fail("unknown sequence {}", seq);
  if (options_.recurrent && free_cells_.empty())
    fail("no free sequence state to fork sequence {} (all {} are in use)", seq, options_.n_seq_max);
  const KvCache::Fork fork = kv_.fork_sequence(seq);
  if (fork.copy_src >= 0 && device_) device_->copy_kv_block(fork.copy_src, fork.copy_dst);
  SeqState st;
  st.snapshots = it->second.snapshots;
  if (options_.recurrent) {
    st.cell = free_cells_.back();
    free_cells_.pop_back();
    if (device_) device_->copy_state(it->second.cell, st.cell);
  }
  seqs_.emplace(fork.seq, st);
  return fork.seq;
}

int SequenceMemory::state_cell(int seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) fail("unknown sequence {}", seq);
  return it->second.cell;
}

void SequenceMemory::keep_state(int seq) {
  if (!options_.recurrent) return;
  if (!options_.rollback) fail("internal error: this memory keeps no state to roll back to");
  SeqState& st = seqs_.at(seq);
  if (device_) device_->copy_state(st.cell, backup_base_ + st.cell);
  st.kept_len = kv_.length(seq);
}

int SequenceMemory::roll_back(int seq, int length) {
  if (!options_.recurrent) return kv_.truncate(seq, length);
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) fail("unknown sequence {}", seq);
  SeqState& st = it->second;
  if (length == kv_.length(seq)) return length;
  ROOFLINE_CHECK(options_.rollback && st.kept_len >= 0 && st.kept_len <= length,
                 "sequence {}: no kept state to go back to {} positions", seq, length);
  if (device_) device_->copy_state(backup_base_ + st.cell, st.cell);
  const int kept = kv_.truncate(seq, st.kept_len);
  ROOFLINE_CHECK(kept == st.kept_len, "cutting sequence {} back to {} positions left {}", seq, st.kept_len, kept);
  if (st.snap >= 0 && st.snap_pos > kept) st.snap_pos = 0;  // the snapshot holds rejected drafts
  return kept;
}

int SequenceMemory::truncate(int seq, int length) {
  if (options_.recurrent && length != kv_.length(seq))
    fail("sequence {}: a model with recurrent layers cannot go back to an earlier position", seq);
  return kv_.truncate(seq, length);
}

void SequenceMemory::commit(int seq, int n_new) {
  kv_.commit(seq, n_new);
  if (!options_.recurrent || options_.windowed || options_.n_snapshots == 0 || n_new == 0) return;
  const int len = kv_.length(seq);
  if (len % kv_.block_size() != 0) return;
  SeqState& st = seqs_.at(seq);
  if (!st.snapshots) return;
  if (st.snap < 0) st.snap = take_snapshot_cell();
  if (st.snap < 0) return;  // every snapshot cell is held by a live sequence
  if (device_) device_->copy_state(st.cell, st.snap);
  st.snap_pos = len;
}

const SequenceMemory::Snapshot* SequenceMemory::valid_snapshot(int32_t block) const {
  auto it = snapshots_.find(block);
  if (it == snapshots_.end() || kv_.block_hash(block) != it->second.hash) return nullptr;
  return &it->second;
}

int SequenceMemory::take_snapshot_cell() {
  // Snapshots whose block was evicted or reused hold their cells for nothing: free them first.
  for (auto it = snapshots_.begin(); it != snapshots_.end();) {
    if (kv_.block_hash(it->first) != it->second.hash) {
      free_snap_cells_.push_back(it->second.cell);
      snapshot_lru_.erase(it->second.lru);
      it = snapshots_.erase(it);
    } else {
      ++it;
    }
  }
  if (free_snap_cells_.empty() && !snapshot_lru_.empty()) {
    const int32_t oldest = snapshot_lru_.front();
    snapshot_lru_.pop_front();
    free_snap_cells_.push_back(snapshots_.at(oldest).cell);
    snapshots_.erase(oldest);
  }
  if (free_snap_cells_.empty()) return -1;
  const int cell = free_snap_cells_.back();
  free_snap_cells_.pop_back();
  return cell;
}

void SequenceMemory::cache_blocks(int seq, std::span<const int32_t> tokens, int snapshot_at) {
  kv_.cache_blocks(seq, tokens);
  if (!options_.recurrent) return;
  if (options_.windowed) {
    keep_window(seq, tokens, snapshot_at < 0 ? (int)tokens.size() : snapshot_at);
    return;
  }
  SeqState& st = seqs_.at(seq);
  if (st.snap < 0 || st.snap_pos == 0 || (size_t)st.snap_pos > tokens.size()) return;
  // The block chain that holds tokens[0, snap_pos) in the index (the sequence's own blocks, or equal
  // blocks indexed earlier): the snapshot is the state after its last block.
  const int n_blocks = st.snap_pos / kv_.block_size();
  const std::vector<int32_t> chain = kv_.matched_blocks(tokens.first((size_t)st.snap_pos), n_blocks);
  if ((int)chain.size() != n_blocks) return;
  const int32_t block = chain.back();
  if (valid_snapshot(block)) return;  // already cached; ours stays with the sequence
  auto old = snapshots_.find(block);
  if (old != snapshots_.end()) {  // a stale entry of an earlier use of this block
    free_snap_cells_.push_back(old->second.cell);
    snapshot_lru_.erase(old->second.lru);
    snapshots_.erase(old);
  }
  Snapshot snap;
  snap.cell = st.snap;
  snap.hash = kv_.block_hash(block);
  snap.lru = snapshot_lru_.insert(snapshot_lru_.end(), block);
  snapshots_.emplace(block, snap);
  st.snap = -1;
  st.snap_pos = 0;
}

void SequenceMemory::keep_window(int seq, std::span<const int32_t> tokens, int boundary) {
  if (options_.n_snapshots == 0 || boundary <= 0) return;
  const int bs = kv_.block_size(), len = kv_.length(seq);
  const int b = std::min({boundary, (int)tokens.size(), len}) / bs * bs;
  if (b == 0) return;
  // The state at b: the sliding layers' K/V of positions [b - window + 1, b), still in the ring while
  // none of them was overwritten (slot p % ring holds p while p >= len - ring).
  const int first_pos = std::max(0, b - options_.window + 1);
  if (first_pos < len - options_.ring) return;
  const std::vector<int32_t> chain = kv_.matched_blocks(tokens.first((size_t)b), b / bs);
  if ((int)chain.size() != b / bs) return;
  const int32_t block = chain.back();
  if (const Snapshot* have = valid_snapshot(block)) {  // already kept: now the most recently used
    snapshot_lru_.splice(snapshot_lru_.end(), snapshot_lru_, have->lru);
    return;
  }
  auto old = snapshots_.find(block);
  if (old != snapshots_.end()) {  // a stale entry of an earlier use of this block
    free_snap_cells_.push_back(old->second.cell);
    snapshot_lru_.erase(old->second.lru);
    snapshots_.erase(old);
  }
  const int cell = take_snapshot_cell();
  if (cell < 0) return;
  Snapshot snap;
  snap.cell = cell;
  snap.first_block = first_pos / bs;
  snap.n_blocks = b / bs - snap.first_block;
  ROOFLINE_CHECK(snap.n_blocks <= window_snapshot_blocks(options_.window, bs, options_.ring));
  if (device_) device_->save_window(seqs_.at(seq).cell, snap.first_block, snap.n_blocks, cell);
  snap.hash = kv_.block_hash(block);
  snap.lru = snapshot_lru_.insert(snapshot_lru_.end(), block);
  snapshots_.emplace(block, snap);
}

int SequenceMemory::reusable_blocks(const std::vector<int32_t>& chain) const {
  for (int n = (int)chain.size(); n > 0; --n)
    if (valid_snapshot(chain[(size_t)n - 1])) return n;
  return 0;
}

int SequenceMemory::match_prefix(std::span<const int32_t> tokens, int max_blocks, int* unreferenced) const {
  if (!options_.recurrent) return kv_.match_prefix(tokens, max_blocks, unreferenced);
  if (unreferenced) *unreferenced = 0;
  if (options_.n_snapshots == 0) return 0;
  const std::vector<int32_t> chain = kv_.matched_blocks(tokens, max_blocks);
  const int n = reusable_blocks(chain);
  if (unreferenced)
    for (int i = 0; i < n; ++i) *unreferenced += kv_.block_refcount(chain[(size_t)i]) == 0 ? 1 : 0;
  return n;
}

int SequenceMemory::adopt_prefix(int seq, std::span<const int32_t> tokens, int max_blocks) {
  if (!options_.recurrent) return kv_.adopt_prefix(seq, tokens, max_blocks);
  const int n = match_prefix(tokens, max_blocks);
  if (n == 0) return 0;
  const int32_t last = kv_.matched_blocks(tokens, n).back();
  const int adopted = kv_.adopt_prefix(seq, tokens, n);
  ROOFLINE_CHECK(adopted == n * kv_.block_size());
  auto it = snapshots_.find(last);
  if (device_ && options_.windowed)
    device_->load_window(it->second.cell, seqs_.at(seq).cell, it->second.first_block, it->second.n_blocks);
  else if (device_)
    device_->copy_state(it->second.cell, seqs_.at(seq).cell);
  snapshot_lru_.splice(snapshot_lru_.end(), snapshot_lru_, it->second.lru);  // most recently used
  return adopted;
}

void SequenceMemory::clear_prefix_cache() {
  kv_.clear_prefix_cache();
  for (auto& [block, snap] : snapshots_) free_snap_cells_.push_back(snap.cell);
  snapshots_.clear();
  snapshot_lru_.clear();
}

}  // namespace roofline
