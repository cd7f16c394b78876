// ShardPlan (reduce/shard_plan.h) as a property test over seeded random
// calls: shards partition the buffer, chunks partition each shard within
// the chunk size, a split call gives every server the same bytes give or
// take one element, and a run of calls keeps the servers' running totals
// within one shard of each other (docs/design.md, "The allreduce path", step 3).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "reduce/shard_plan.h"
#include "transport/frame.h"

namespace {

using namespace smddp;

struct Call {
  uint64_t numel;
  size_t elemSize;
  int servers;
  uint64_t seq;
  uint64_t minShardBytes;
  uint64_t chunkBytes;
};

std::string describe(const Call& c) {
  std::ostringstream s;
  s << "numel=" << c.numel << " elemSize=" << c.elemSize << " servers=" << c.servers
    << " seq=" << c.seq << " minShardBytes=" << c.minShardBytes << " chunkBytes=" << c.chunkBytes;
  return s.str();
}

ShardPlan planOf(const Call& c) {
  return ShardPlan::make(c.numel, c.elemSize, c.servers, c.seq, c.minShardBytes, c.chunkBytes);
}

// The documented rule: split only when every server would get at least
// minShardBytes and at least one element.
bool shouldSplit(const Call& c) {
  const uint64_t s = static_cast<uint64_t>(c.servers);
  return s > 1 && c.numel >= s && c.numel * c.elemSize / s >= c.minShardBytes;
}

uint64_t ceilDiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

Call randomCall(std::mt19937_64& rng) {
  auto pick = [&](uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  };
  Call c;
  // Sizes on a log scale so that tiny, borderline and large calls all occur.
  c.numel = pick(0, 3) == 0 ? pick(0, 40) : pick(0, uint64_t{1} << pick(1, 20));
  c.elemSize = size_t{1} << pick(0, 3);
  c.servers = static_cast<int>(pick(1, 16));
  c.seq = pick(0, 3) == 0 ? pick(0, 40) : rng();
  c.minShardBytes = pick(1, uint64_t{1} << pick(0, 16));
  // Now and then a chunk smaller than one element.
  c.chunkBytes = pick(0, 9) == 0 ? pick(1, 7) : pick(1, uint64_t{1} << pick(3, 18));
  // At most a few thousand chunks, so the run stays quick.
  c.chunkBytes = std::max<uint64_t>(c.chunkBytes, c.numel * c.elemSize / 4096);
  return c;
}

// Checks one plan against the closed-form rules; returns "" or a failure.
std::string checkPlan(const Call& c, const ShardPlan& plan) {
  const auto& shards = plan.shards();
  const uint64_t S = static_cast<uint64_t>(c.servers);
  if (shards.empty()) return "no shards";

  // Shape: one shard at seq % S, or one shard per server.
  if (shouldSplit(c)) {
    if (shards.size() != S) return "split into " + std::to_string(shards.size()) + " shards";
    std::set<int> servers;
    for (const auto& s : shards) servers.insert(s.server);
    if (servers.size() != S || *servers.begin() != 0 || *servers.rbegin() != c.servers - 1) {
      return "servers are not 0..S-1, once each";
    }
  } else {
    if (shards.size() != 1) return "unsplit call has " + std::to_string(shards.size()) + " shards";
    if (shards[0].server != static_cast<int>(c.seq % S)) {
      return "unsplit call went to server " + std::to_string(shards[0].server) +
             " instead of seq % S = " + std::to_string(c.seq % S);
    }
  }

  // Shards partition [0, numel): ordered, contiguous, no overlap.
  uint64_t next = 0;
  for (const auto& s : shards) {
    if (s.elemOffset != next) {
      return "shard of server " + std::to_string(s.server) + " starts at " +
             std::to_string(s.elemOffset) + ", expected " + std::to_string(next);
    }
    next += s.elemCount;
  }
  if (next != c.numel) return "shards cover " + std::to_string(next) + " elements";

  // Balance: equal shares, give or take one element.
  uint64_t lo = UINT64_MAX, hi = 0;
  for (const auto& s : shards) {
    lo = std::min(lo, s.elemCount);
    hi = std::max(hi, s.elemCount);
  }
  if (hi != plan.maxShardElems()) return "maxShardElems() disagrees";
  if (shards.size() > 1) {
    if (hi - lo > 1) {
      return "shards range from " + std::to_string(lo) + " to " + std::to_string(hi) +
             " elements";
    }
    if (hi != ceilDiv(c.numel, S)) return "largest shard is not ceil(numel / S)";
  }

  // shardFor finds each server's shard and nothing else.
  for (int server = 0; server < c.servers; ++server) {
    const Shard* mine = plan.shardFor(server);
    auto it = std::find_if(shards.begin(), shards.end(),
                           [&](const Shard& s) { return s.server == server; });
    if (mine != (it == shards.end() ? nullptr : &*it)) {
      return "shardFor(" + std::to_string(server) + ") is wrong";
    }
  }

  // Chunks partition each shard, at most chunkBytes (or one element) each,
  // as few as possible, with indices unique across the whole call.
  const uint64_t chunkElems = std::max<uint64_t>(1, c.chunkBytes / c.elemSize);
  std::set<uint32_t> indices;
  size_t chunkCount = 0;
  for (const auto& s : shards) {
    const uint64_t expectChunks = std::max<uint64_t>(1, ceilDiv(s.elemCount, chunkElems));
    if (s.chunks.size() != expectChunks) {
      return "shard of " + std::to_string(s.elemCount) + " elements has " +
             std::to_string(s.chunks.size()) + " chunks, expected " +
             std::to_string(expectChunks);
    }
    uint64_t at = s.elemOffset;
    for (const auto& ch : s.chunks) {
      if (ch.elemOffset != at) return "chunks of a shard are not contiguous";
      if (ch.elemCount > chunkElems) return "chunk larger than chunkBytes";
      if (ch.elemCount == 0 && s.elemCount != 0) return "empty chunk in a non-empty shard";
      if (ch.index >= kMaxChunksPerPhase) return "chunk index does not fit a tag";
      indices.insert(ch.index);
      ++chunkCount;
      at += ch.elemCount;
    }
    if (at != s.elemOffset + s.elemCount) return "chunks do not cover their shard";
  }
  if (indices.size() != chunkCount) return "chunk indices repeat";
  return "";
}

}  // namespace

TEST_CASE("random plans partition, chunk and balance the buffer", "[shard_plan]") {
  std::mt19937_64 rng(0x5eed5a11);
  int split = 0, unsplit = 0;
  for (int i = 0; i < 4000; ++i) {
    Call c = randomCall(rng);
    std::string bad = checkPlan(c, planOf(c));
    if (!bad.empty()) FAIL(describe(c) << ": " << bad);
    (shouldSplit(c) ? split : unsplit)++;
  }
  // The generator must exercise both rules.
  CHECK(split > 500);
  CHECK(unsplit > 500);
}

TEST_CASE("a run of calls keeps every server's running total within one shard",
          "[shard_plan]") {
  // A training loop repeats the same calls; the sequence number advances by
  // one per call. Unsplit calls rotate over the servers, and split calls
  // must not always hand the leftover elements to the same servers.
  std::mt19937_64 rng(0xba1a9ce);
  for (int trial = 0; trial < 400; ++trial) {
    Call c = randomCall(rng);
    if (trial % 2 == 0) c.minShardBytes = 1;  // half the trials split when they can
    const uint64_t S = static_cast<uint64_t>(c.servers);
    const int calls = static_cast<int>(std::uniform_int_distribution<int>(1, 3 * c.servers)(rng));
    std::vector<uint64_t> total(S, 0);
    uint64_t maxShardBytes = 0;
    for (int k = 0; k < calls; ++k) {
      Call ck = c;
      ck.seq = c.seq + static_cast<uint64_t>(k);
      ShardPlan plan = planOf(ck);
      for (const auto& s : plan.shards()) total[s.server] += s.elemCount * c.elemSize;
      maxShardBytes = std::max(maxShardBytes, plan.maxShardElems() * c.elemSize);
      auto [lo, hi] = std::minmax_element(total.begin(), total.end());
      if (*hi - *lo > maxShardBytes) {
        FAIL(describe(ck) << ": after " << k + 1 << " calls the servers hold between " << *lo
                          << " and " << *hi << " bytes, more than one shard (" << maxShardBytes
                          << " bytes) apart");
      }
    }
  }
}

TEST_CASE("repeated split calls spread the leftover elements evenly", "[shard_plan]") {
  // 16 servers, 17 elements: one leftover per call. After 16 calls every
  // server must have served exactly 17 elements.
  for (uint64_t seq0 : {0ull, 5ull, 1000003ull}) {
    std::vector<uint64_t> total(16, 0);
    for (uint64_t k = 0; k < 16; ++k) {
      ShardPlan plan = ShardPlan::make(17, 4, 16, seq0 + k, 1, 1 << 20);
      for (const auto& s : plan.shards()) total[s.server] += s.elemCount;
    }
    INFO("first seq " << seq0);
    for (uint64_t t : total) CHECK(t == 17);
  }
}

TEST_CASE("small calls go whole to server seq % S", "[shard_plan]") {
  // 4 servers x 1 KiB minimum: 1023 float32 (4092 bytes) stay whole.
  for (uint64_t seq : {0ull, 1ull, 2ull, 3ull, 4ull, 7ull, 0xffffffffffffffffull}) {
    ShardPlan small = ShardPlan::make(1023, 4, 4, seq, 1024, 1 << 20);
    REQUIRE(small.shards().size() == 1);
    CHECK(small.shards()[0].server == static_cast<int>(seq % 4));
    CHECK(small.shards()[0].elemCount == 1023);
    CHECK(small.shardFor(static_cast<int>((seq + 1) % 4)) == nullptr);
  }
  CHECK(ShardPlan::make(1024, 4, 4, 9, 1024, 1 << 20).shards().size() == 4);
  CHECK(ShardPlan::make(1023, 4, 4, 9, 1024, 1 << 20).shards().size() == 1);
  // Fewer elements than servers never split, however small the minimum.
  CHECK(ShardPlan::make(3, 8, 4, 9, 1, 1 << 20).shards().size() == 1);
  // One server never splits.
  CHECK(ShardPlan::make(1 << 20, 4, 1, 9, 1, 1 << 20).shards().size() == 1);
}

TEST_CASE("an empty call is one empty shard with one empty chunk", "[shard_plan]") {
  for (int servers : {1, 2, 16}) {
    for (uint64_t seq : {0ull, 3ull, 17ull}) {
      ShardPlan plan = ShardPlan::make(0, 4, servers, seq, 1, 4096);
      REQUIRE(plan.shards().size() == 1);
      const Shard& s = plan.shards()[0];
      CHECK(s.server == static_cast<int>(seq % static_cast<uint64_t>(servers)));
      CHECK(s.elemOffset == 0);
      CHECK(s.elemCount == 0);
      REQUIRE(s.chunks.size() == 1);
      CHECK(s.chunks[0].elemCount == 0);
      CHECK(plan.maxShardElems() == 0);
    }
  }
}

TEST_CASE("a chunk smaller than one element still carries one element", "[shard_plan]") {
  ShardPlan plan = ShardPlan::make(5, 8, 1, 0, 1, 3);
  REQUIRE(plan.shards().size() == 1);
  REQUIRE(plan.shards()[0].chunks.size() == 5);
  for (uint32_t i = 0; i < 5; ++i) {
    CHECK(plan.shards()[0].chunks[i].elemCount == 1);
    CHECK(plan.shards()[0].chunks[i].elemOffset == i);
  }
}

TEST_CASE("bad arguments are rejected", "[shard_plan]") {
  CHECK_THROWS_AS(ShardPlan::make(10, 4, 0, 0, 1, 4096), Error);
  CHECK_THROWS_AS(ShardPlan::make(10, 0, 2, 0, 1, 4096), Error);
}
