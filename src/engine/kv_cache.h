// The paged KV cache's bookkeeping: a pool of fixed-size blocks with reference counts, and per
// sequence a block table and a length. Full blocks can be shared between sequences (a common
// prompt prefix is stored once); a sequence only ever writes into blocks it owns alone. Where the
// K/V values live and how a block is laid out belongs to each backend (backend.h).
// Prompt caching: full blocks can be indexed by a hash chain of the token ids they hold; an indexed
// block nobody references stays cached (counted as free) until the pool needs it, least recently
// used first, so a later prompt with the same prefix adopts those blocks instead of recomputing them.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <span>
#include <unordered_map>
#include <vector>

namespace roofline {

class KvCache {
 public:
  KvCache(int n_blocks, int block_size);

  int n_blocks() const { return (int)refs_.size(); }
  int block_size() const { return block_size_; }
  // Blocks a sequence can get: never used, plus cached blocks no sequence references (evictable).
  int free_blocks() const { return (int)(free_.size() + lru_.size()); }
  int used_blocks() const { return n_blocks() - free_blocks(); }
  int capacity_tokens() const { return n_blocks() * block_size_; }

  int create_sequence();  // an empty sequence; returns its id
  bool has_sequence(int seq) const { return seqs_.count(seq) != 0; }
  void free_sequence(int seq);
  // A new sequence sharing `seq`'s full blocks; its partial last block (if any) must be copied by the
  // caller with the backends: returns {new seq, source block, destination block} (-1s when none).
  struct Fork {
    int seq;
    int copy_src;
    int copy_dst;
  };
  Fork fork_sequence(int seq);
  // Drops positions >= length, freeing blocks no longer needed. Returns the new length, which is
  // rounded down to a block boundary when the cut falls inside a block shared with another sequence.
  int truncate(int seq, int length);

  int length(int seq) const;
  const std::vector<int32_t>& block_table(int seq) const;

  // Blocks needed to grow `seq` by n tokens, without allocating.
  int blocks_needed(int seq, int n_new) const;
  // Makes room for n more tokens (allocating blocks); returns false (changing nothing) if the pool is short.
  bool reserve(int seq, int n_new);
  // Marks n tokens as written (after a successful step).
  void commit(int seq, int n_new);

  int block_refcount(int block) const { return refs_[block]; }

  // --- Prompt caching (prefix index of full blocks) ---
  // Indexes the full blocks of `seq` that hold tokens[0, n) (tokens: what the sequence's positions
  // hold, at most its length). Blocks already indexed, or whose content another block already
  // stands for, are left as they are.
  void cache_blocks(int seq, std::span<const int32_t> tokens);
  // Cached blocks covering the longest block-aligned prefix of `tokens`, at most max_blocks of them;
  // `unreferenced` (optional) receives how many of those no sequence holds now (adopting them takes
  // them out of free_blocks()).
  int match_prefix(std::span<const int32_t> tokens, int max_blocks, int* unreferenced = nullptr) const;
  // The blocks of that match, in order (its length is what match_prefix returns).
  std::vector<int32_t> matched_blocks(std::span<const int32_t> tokens, int max_blocks) const;
  // A block's place in the prefix index (0: not indexed); changes when the block is evicted or reused.
  uint64_t block_hash(int block) const { return block_hash_[block]; }
  // Gives the empty sequence `seq` the cached blocks of the longest prefix of `tokens` (at most
  // max_blocks); returns the positions adopted (a multiple of block_size()).
  int adopt_prefix(int seq, std::span<const int32_t> tokens, int max_blocks);
  int cached_blocks() const { return (int)index_.size(); }  // indexed blocks, referenced or not
  int evictable_blocks() const { return (int)lru_.size(); }  // indexed blocks nobody references
  void clear_prefix_cache();                                 // forgets every index entry

 private:
  struct Sequence {
    std::vector<int32_t> blocks;
    int length = 0;
  };
  const Sequence& get(int seq) const;
  Sequence& get(int seq);
  int allocate_block();
  void release_block(int block);
  void unindex_block(int block);
  uint64_t chain_hash(uint64_t parent, std::span<const int32_t> block_tokens) const;

  int block_size_;
  std::vector<int> refs_;
  std::vector<int32_t> free_;  // stack of free block ids
  std::map<int, Sequence> seqs_;
  int next_seq_ = 0;
  // Prefix index: chain hash -> block; per block its hash (0: not indexed) and its tokens (checked
  // on lookup, so a hash collision can never hand out wrong contents).
  std::unordered_map<uint64_t, int32_t> index_;
  std::vector<uint64_t> block_hash_;
  std::vector<std::vector<int32_t>> block_tokens_;
  std::list<int32_t> lru_;  // indexed blocks with refcount 0, least recently used first
  std::vector<std::list<int32_t>::iterator> lru_pos_;
  std::vector<uint8_t> in_lru_;
};

}  // namespace roofline
