// What a sequence carries from step to step, as one interface the engine owns and the server uses:
// the paged KV cache of the attention layers (blocks shared between sequences, prompt caching by
// prefix, kv_cache.h) and, for models with recurrent (Gated DeltaNet) layers, a state cell per live
// sequence. A recurrent state cannot be cut back to an earlier position, so prompt caching on such
// models keeps state snapshots taken when a sequence's length reaches a block boundary, and a later
// prompt reuses a cached prefix only up to a block that has one: never a wrong answer, at most a
// shorter reuse. Copies of blocks and states are asked of the backends through Device.
// Models whose only such memory is sliding-window rings (gemma3: `windowed`) need no snapshot per block:
// a ring still holds the window before any recent block boundary, so a snapshot of just that window
// (window - 1 positions in whole blocks, kept by the backends in host memory, as llama.cpp's context
// checkpoints are) is taken when a prefix is cached, and restored into a new sequence's ring on reuse.
// Speculative decoding on such models (`rollback`): every live sequence has a second state cell; before
// a step that verifies drafts the state is kept there (keep_state), and when drafts are rejected the
// sequence goes back to it (roll_back: the kept state, the KV cut to the kept length), after which the
// caller feeds the accepted tokens again.
#pragma once

#include <algorithm>
#include <cstdint>
#include <list>
#include <map>
#include <span>
#include <vector>

#include "engine/kv_cache.h"

namespace roofline {

class SequenceMemory {
 public:
  // What the memory asks of the backends (every backend copies the layers it holds).
  class Device {
   public:
    virtual ~Device() = default;
    virtual void copy_kv_block(int src, int dst) = 0;
    virtual void copy_state(int src, int dst) = 0;
    // Windowed models: blocks [first_block, first_block + n_blocks) of the sequence in state cell `cell`
    // into host snapshot `snapshot`, and back into another cell's ring.
    virtual void save_window(int cell, int first_block, int n_blocks, int snapshot);
    virtual void load_window(int snapshot, int cell, int first_block, int n_blocks);
  };
  struct Options {
    int n_blocks = 0;
    int block_size = 32;
    bool recurrent = false;  // the model has recurrent layers: sequences need state cells
    int n_seq_max = 1;       // recurrent: sequences that may live at once (one state cell each)
    int n_snapshots = 0;     // recurrent: state cells kept for prompt caching (0: no reuse of prefixes)
    // Sliding-window rings only (no recurrent layer; needs `recurrent`): the ring's positions per sequence
    // and the model's window; snapshots are then host window snapshots, not state cells.
    bool windowed = false;
    int ring = 0;
    int window = 0;
    // Recurrent: a second state cell per live sequence, to return to the state before a verification step.
    bool rollback = false;
  };
  // State cells the backends need: n_seq_max (+ n_snapshots unless windowed, + n_seq_max with rollback)
  // for recurrent models, else 0.
  static int state_cells(const Options& o) {
    return o.recurrent ? o.n_seq_max + (o.windowed ? 0 : o.n_snapshots) + (o.rollback ? o.n_seq_max : 0) : 0;
  }
  // Windowed models: the blocks one window snapshot holds (window - 1 positions before a block boundary).
  static int window_snapshot_blocks(int window, int block_size, int ring) {
    return std::min((std::max(window - 1, 0) + block_size - 1) / block_size, ring / block_size);
  }

  SequenceMemory(const Options& options, Device* device);

  // --- geometry and accounting ---
  bool recurrent() const { return options_.recurrent; }  // sequences cannot be cut back
  bool windowed() const { return options_.windowed; }
  int block_size() const { return kv_.block_size(); }
  int n_blocks() const { return kv_.n_blocks(); }
  int free_blocks() const { return kv_.free_blocks(); }
  int used_blocks() const { return kv_.used_blocks(); }
  int capacity_tokens() const { return kv_.capacity_tokens(); }
  int cached_blocks() const { return kv_.cached_blocks(); }
  int evictable_blocks() const { return kv_.evictable_blocks(); }
  // Sequences that can still be created (unbounded for models without recurrent layers).
  int free_sequences() const;
  int n_state_snapshots() const;  // snapshots held (cached or taken by live sequences)

  // --- sequences ---
  // Throws Error when every state cell is taken. `snapshots`: the sequence leaves state snapshots for
  // prompt caching (recurrent models with snapshot cells); off for sequences that will not be cached.
  int create_sequence(bool snapshots = true);
  bool has_sequence(int seq) const { return kv_.has_sequence(seq); }
  void free_sequence(int seq);
  // A new sequence continuing `seq`: full KV blocks shared, the partial one and the state copied
  // (it leaves snapshots when `seq` does).
  int fork_sequence(int seq);
  int length(int seq) const { return kv_.length(seq); }
  const std::vector<int32_t>& block_table(int seq) const { return kv_.block_table(seq); }
  int state_cell(int seq) const;  // -1 without recurrent layers
  // Drops positions >= length (models without recurrent layers only; see KvCache::truncate).
  int truncate(int seq, int length);
  // Whether a sequence can go back to an earlier position: always without recurrent layers (truncate),
  // with them through keep_state / roll_back when the memory has rollback cells.
  bool can_roll_back() const { return !options_.recurrent || options_.rollback; }
  // Recurrent models with rollback cells: keeps the sequence's state at its current length (a state
  // copy on the backends, ordered after the steps already launched). A no-op without recurrent layers.
  void keep_state(int seq);
  // Cuts the sequence back to `length` positions (drafts rejected after a verification step). Without
  // recurrent layers: truncate, returns `length`. With them: restores the state kept by the last
  // keep_state (taken at a length <= `length`), cuts the KV to that length and returns it; the caller
  // feeds the tokens from there up to `length` again. A prompt-cache snapshot the sequence took past
  // the returned length is dropped (it holds the rejected drafts).
  int roll_back(int seq, int length);

  // --- a step ---
  int blocks_needed(int seq, int n_new) const { return kv_.blocks_needed(seq, n_new); }
  bool reserve(int seq, int n_new) { return kv_.reserve(seq, n_new); }
  // Marks n tokens written after a step; on recurrent models with snapshots, a sequence whose length
  // lands on a block boundary gets its state snapshot there (a state copy on the backends).
  void commit(int seq, int n_new);

  // --- prompt caching ---
  // Indexes the full blocks of `seq` holding tokens[0, n) (and attaches its snapshot when its block is
  // indexed), so later prompts with the same prefix can adopt them. Windowed models take a window
  // snapshot at the last block boundary <= snapshot_at (-1: n; 0: none) when the ring still holds it.
  void cache_blocks(int seq, std::span<const int32_t> tokens, int snapshot_at = -1);
  // Cached blocks of the longest block-aligned prefix of `tokens` that can be reused (recurrent: ending
  // at a block with a state snapshot), at most max_blocks; `unreferenced` as KvCache::match_prefix.
  int match_prefix(std::span<const int32_t> tokens, int max_blocks, int* unreferenced = nullptr) const;
  // Gives the empty sequence `seq` that prefix (and its state); returns the positions adopted.
  int adopt_prefix(int seq, std::span<const int32_t> tokens, int max_blocks);
  void clear_prefix_cache();
  // Positions at which a prompt chunk should end so the state there can be kept (recurrent models
  // with snapshots: the block size; 0 otherwise).
  int snapshot_interval() const {
    return options_.recurrent && !options_.windowed && options_.n_snapshots > 0 ? kv_.block_size() : 0;
  }

  const KvCache& kv() const { return kv_; }

 private:
  struct SeqState {
    int cell = -1;       // live state
    int snap = -1;       // a snapshot cell this sequence took and still owns (-1: none)
    int snap_pos = 0;    // the length at which it was taken
    bool snapshots = true;
    int kept_len = -1;   // rollback: the length at which the state was kept in backup_cell (-1: none)
  };
  struct Snapshot {      // a cached snapshot, valid while its block keeps the same index hash
    int cell = -1;       // a state cell, or (windowed) a host window snapshot
    int first_block = 0, n_blocks = 0;  // windowed: the sequence's blocks it holds
    uint64_t hash = 0;
    std::list<int32_t>::iterator lru;
  };
  int take_snapshot_cell();                  // a free snapshot cell, evicting the oldest cached one; -1 if none
  void attach_snapshot(int seq);             // hands the sequence's snapshot to the cache if its block is indexed
  int reusable_blocks(const std::vector<int32_t>& chain) const;  // prefix length ending at a valid snapshot
  const Snapshot* valid_snapshot(int32_t block) const;
  void keep_window(int seq, std::span<const int32_t> tokens, int boundary);  // windowed cache_blocks

  Options options_;
  Device* device_;
  KvCache kv_;
  std::map<int, SeqState> seqs_;
  std::vector<int> free_cells_;          // live-state cells
  int backup_base_ = 0;                  // rollback: live cell c keeps its state in cell backup_base_ + c
  std::vector<int> free_snap_cells_;     // snapshot cells nobody holds
  std::map<int32_t, Snapshot> snapshots_;  // block -> cached snapshot of the state after it
  std::list<int32_t> snapshot_lru_;        // blocks with cached snapshots, least recently used first
};

}  // namespace roofline
