// Balanced sharding of one collective's buffer across the reduction servers.
// Each call is cut into S equal, element-aligned shards (one per server);
// a call too small to split goes whole to one server picked round-robin by
// sequence number. Shards are then cut into chunks for pipelining.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace smddp {

struct Chunk {
  uint32_t index;       // unique within the collective: part of the tag
  uint64_t elemOffset;  // from the start of the whole buffer
  uint64_t elemCount;
};

struct Shard {
  int server;
  uint64_t elemOffset;
  uint64_t elemCount;
  std::vector<Chunk> chunks;
};

// Server `server`'s share of an even split of `numel` elements over `servers`:
// floor(numel / S) each, the numel % S leftovers one each to a run of servers
// starting at (rotation * leftover) % S, so successive calls (rotation = seq
// or batch index) spread the leftovers round-robin. Returns {offset, count}.
struct Range {
  uint64_t offset;
  uint64_t count;
};
Range balancedShard(uint64_t numel, int servers, int server, uint64_t rotation);

class ShardPlan {
 public:
  // `minShardBytes`: below numServers * minShardBytes the call is not split.
  // `chunkBytes`: upper bound of one chunk (at least one element).
  static ShardPlan make(uint64_t numel, size_t elemSize, int numServers, uint64_t seq,
                        uint64_t minShardBytes, uint64_t chunkBytes);

  const std::vector<Shard>& shards() const { return shards_; }
  // The shard served by `server`, or nullptr.
  const Shard* shardFor(int server) const;
  uint64_t maxShardElems() const;

 private:
  std::vector<Shard> shards_;
};

}  // namespace smddp
