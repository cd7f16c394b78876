#include "engine/shard_plan.h"

#include <algorithm>

#include "common/error.h"
#include "transport/frame.h"

namespace smddp {

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
    // floor(numel / S) each, and the numel % S leftover elements one each
    // to a run of servers. The run starts where the previous sequence's run
    // ended (seq * leftover mod S), so repeated calls deal the leftovers
    // round-robin instead of always loading the same servers: shards differ
    // by at most one element, and running totals by at most one too.
    const uint64_t S = static_cast<uint64_t>(numServers);
    const uint64_t base = numel / S;
    const uint64_t leftover = numel % S;
    const uint64_t first = (seq % S) * leftover % S;
    uint64_t off = 0;
    for (int s = 0; s < numServers; ++s) {
      uint64_t fromFirst = (static_cast<uint64_t>(s) + S - first) % S;
      uint64_t cnt = base + (fromFirst < leftover ? 1 : 0);
      plan.shards_.push_back({s, off, cnt, {}});
      off += cnt;
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
