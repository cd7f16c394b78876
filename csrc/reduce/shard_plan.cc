#include "reduce/shard_plan.h"

#include <algorithm>

#include "common/error.h"
#include "common/wire_limits.h"

namespace smddp {

Range balancedShard(uint64_t numel, int servers, int server, uint64_t rotation) {
  const uint64_t S = static_cast<uint64_t>(servers);
  const uint64_t base = numel / S;
  const uint64_t leftover = numel % S;
  const uint64_t first = (rotation % S) * leftover % S;
  // Servers first, first+1, ... (mod S) get one extra element each.
  auto extra = [&](uint64_t s) { return (s + S - first) % S < leftover ? 1u : 0u; };
  // Extras before `server`: count the run's members below it.
  uint64_t before = 0;
  const uint64_t sv = static_cast<uint64_t>(server);
  if (leftover) {
    uint64_t runEnd = first + leftover;  // exclusive, may pass S
    before = std::min(sv, runEnd) > first ? std::min(sv, runEnd) - first : 0;
    if (runEnd > S) before += std::min(sv, runEnd - S);
  }
  return {sv * base + before, base + extra(sv)};
}

ShardPlan ShardPlan::make(uint64_t numel, size_t elemSize, int numServers, uint64_t seq,
                          uint64_t minShardBytes, uint64_t chunkBytes) {
  SMDDP_CHECK(numServers >= 1 && elemSize >= 1, kInternal, "bad shard plan arguments");
  ShardPlan plan;
  uint64_t bytes = numel * elemSize;
  bool split = numServers > 1 && numel >= static_cast<uint64_t>(numServers) &&
               bytes / static_cast<uint64_t>(numServers) >= minShardBytes;
  if (!split) {
    plan.shards_.push_back({static_cast<int>(seq % static_cast<uint64_t>(numServers)), 0, numel, {}});
  } else {
    for (int s = 0; s < numServers; ++s) {
      Range r = balancedShard(numel, numServers, s, seq);
      plan.shards_.push_back({s, r.offset, r.count, {}});
    }
  }
  uint64_t chunkElems = std::max<uint64_t>(1, chunkBytes / elemSize);
  uint32_t index = 0;
  for (auto& shard : plan.shards_) {
    uint64_t done = 0;
    do {
      uint64_t cnt = std::min(chunkElems, shard.elemCount - done);
      SMDDP_CHECK(index < kMaxChunksPerPhase, kInvalidArgument,
                  "collective too large for the chunk size; raise SMDDP_CHUNK_BYTES");
      shard.chunks.push_back({index++, shard.elemOffset + done, cnt});
      done += cnt;
    } while (done < shard.elemCount);
  }
  return plan;
}

const Shard* ShardPlan::shardFor(int server) const {
  for (const auto& s : shards_) {
    if (s.server == server) return &s;
  }
  return nullptr;
}

uint64_t ShardPlan::maxShardElems() const {
  uint64_t m = 0;
  for (const auto& s : shards_) m = std::max(m, s.elemCount);
  return m;
}

}  // namespace smddp
