// The paged KV cache's bookkeeping: a pool of fixed-size blocks with reference counts, and per
// sequence a block table and a length. Full blocks can be shared between sequences (a common
// prompt prefix is stored once); a sequence only ever writes into blocks it owns alone. Where the
// K/V values live and how a block is laid out belongs to each backend (backend.h).
#pragma once

#include <cstdint>
#include <map>
#include <vector>

namespace roofline {

class KvCache {
 public:
  KvCache(int n_blocks, int block_size);

  int n_blocks() const { return (int)refs_.size(); }
  int block_size() const { return block_size_; }
  int free_blocks() const { return (int)free_.size(); }
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

 private:
  struct Sequence {
    std::vector<int32_t> blocks;
    int length = 0;
  };
  const Sequence& get(int seq) const;
  Sequence& get(int seq);
  int allocate_block();
  void release_block(int block);

  int block_size_;
  std::vector<int> refs_;
  std::vector<int32_t> free_;  // stack of free block ids
  std::map<int, Sequence> seqs_;
  int next_seq_ = 0;
};

}  // namespace roofline
