// The KV cache's prefix index: full blocks indexed by a hash chain of their tokens, adopted by new
// sequences, kept cached (and counted free) after their sequence ends, evicted least recently used
// first, never written while shared or indexed.
#include <gtest/gtest.h>

#include "core/error.h"
#include "engine/kv_cache.h"

using namespace roofline;

namespace {

std::vector<int32_t> seq_tokens(int n, int salt) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(i * 3 + salt);
  return t;
}

int fill(KvCache& kv, const std::vector<int32_t>& tokens) {
  const int s = kv.create_sequence();
  EXPECT_TRUE(kv.reserve(s, (int)tokens.size()));
  kv.commit(s, (int)tokens.size());
  kv.cache_blocks(s, tokens);
  return s;
}

}  // namespace

TEST(KvPrefixTest, FullBlocksAreIndexedAndAdopted) {
  KvCache kv(16, 4);
  const auto t = seq_tokens(10, 0);  // 2 full blocks + 2 positions
  const int a = fill(kv, t);
  EXPECT_EQ(kv.cached_blocks(), 2);
  EXPECT_EQ(kv.match_prefix(t, 100), 2);
  const int b = kv.create_sequence();
  EXPECT_EQ(kv.adopt_prefix(b, t, 100), 8);
  EXPECT_EQ(kv.length(b), 8);
  EXPECT_EQ(kv.block_table(b)[0], kv.block_table(a)[0]);
  EXPECT_EQ(kv.block_refcount(kv.block_table(a)[0]), 2);
  // The limit is honoured and a different token breaks the chain.
  auto other = t;
  other[5] = 999;
  EXPECT_EQ(kv.match_prefix(other, 100), 1);
  EXPECT_EQ(kv.match_prefix(t, 1), 1);
  // Chains: the same block content after a different prefix does not match.
  std::vector<int32_t> shifted = {100, 101, 102, 103};
  shifted.insert(shifted.end(), t.begin() + 4, t.begin() + 8);
  EXPECT_EQ(kv.match_prefix(shifted, 100), 0);
  kv.free_sequence(a);
  kv.free_sequence(b);
}

TEST(KvPrefixTest, UnreferencedCachedBlocksCountAsFreeAndAreEvictedLruFirst) {
  KvCache kv(6, 4);
  const auto t1 = seq_tokens(8, 0), t2 = seq_tokens(8, 1000);
  const int a = fill(kv, t1);
  kv.free_sequence(a);
  EXPECT_EQ(kv.free_blocks(), 6);
  EXPECT_EQ(kv.used_blocks(), 0);
  EXPECT_EQ(kv.evictable_blocks(), 2);
  const int b = fill(kv, t2);
  kv.free_sequence(b);
  EXPECT_EQ(kv.cached_blocks(), 4);
  int unref = -1;
  EXPECT_EQ(kv.match_prefix(t1, 10, &unref), 2);
  EXPECT_EQ(unref, 2);
  // Using t1 again makes it recent; filling the pool then evicts t2's blocks (its last block first).
  const int c = kv.create_sequence();
  EXPECT_EQ(kv.adopt_prefix(c, t1, 10), 8);
  EXPECT_EQ(kv.free_blocks(), 4);
  kv.free_sequence(c);
  const int d = kv.create_sequence();
  EXPECT_TRUE(kv.reserve(d, 12));  // 3 blocks: 2 never used, then one eviction
  kv.commit(d, 12);
  EXPECT_EQ(kv.match_prefix(t2, 10), 1);  // t2's second block went first
  EXPECT_EQ(kv.match_prefix(t1, 10), 2);
  EXPECT_TRUE(kv.reserve(d, 4));
  kv.commit(d, 4);
  EXPECT_EQ(kv.match_prefix(t2, 10), 0);
  EXPECT_EQ(kv.match_prefix(t1, 10), 2);
  EXPECT_FALSE(kv.reserve(d, 12));  // only t1's two blocks are left
  kv.free_sequence(d);
  kv.clear_prefix_cache();
  EXPECT_EQ(kv.cached_blocks(), 0);
  EXPECT_EQ(kv.free_blocks(), 6);
}

TEST(KvPrefixTest, AdoptionNeedsAnEmptySequenceAndTruncationUnindexesTheBlockItWillWrite) {
  KvCache kv(8, 4);
  const auto t = seq_tokens(8, 0);
  const int a = fill(kv, t);
  EXPECT_THROW(kv.adopt_prefix(a, t, 10), Error);
  // a alone holds its blocks: cutting inside the second one means it will be rewritten.
  EXPECT_EQ(kv.truncate(a, 6), 6);
  EXPECT_EQ(kv.match_prefix(t, 10), 1);
  // A shared block is never cut into: the cut rounds down to the block boundary.
  const int b = kv.create_sequence();
  EXPECT_EQ(kv.adopt_prefix(b, t, 10), 4);
  const int c = kv.fork_sequence(b).seq;
  EXPECT_EQ(kv.truncate(c, 2), 0);
  kv.free_sequence(a);
  kv.free_sequence(b);
  kv.free_sequence(c);
  EXPECT_EQ(kv.used_blocks(), 0);
}

TEST(KvPrefixTest, DuplicateContentKeepsOneIndexEntry) {
  KvCache kv(8, 4);
  const auto t = seq_tokens(4, 7);
  const int a = fill(kv, t);
  const int b = fill(kv, t);  // computed again without adopting: same content, another block
  EXPECT_EQ(kv.cached_blocks(), 1);
  kv.free_sequence(a);
  kv.free_sequence(b);
  EXPECT_EQ(kv.free_blocks(), 8);
  EXPECT_EQ(kv.evictable_blocks(), 1);
}
