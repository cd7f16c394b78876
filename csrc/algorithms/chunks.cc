// How a collective cuts its elements into chunks (algorithms.h): the chunk
// size a huge call or a short shard takes, and the cut itself.

#include <algorithm>

#include "algorithms/algorithms.h"
#include "common/wire_limits.h"

namespace smddp {

uint64_t directChunkBytes(const EngineContext& ctx) {
  return std::min<uint64_t>(ctx.config().chunkBytes, kEagerPayloadBytes);
}

uint64_t effectiveChunkBytes(uint64_t numel, size_t elemSize, uint64_t chunkBytes) {
  uint64_t perChunk = (numel + kMaxChunksPerStream - 1) / kMaxChunksPerStream;
  return std::max<uint64_t>(chunkBytes, perChunk * elemSize);
}

uint64_t shardChunkBytes(uint64_t shardElems, size_t elemSize, size_t wireElemSize,
                         uint64_t chunkBytes, uint64_t minWireBytes) {
  const uint64_t capElems = std::max<uint64_t>(1, chunkBytes / elemSize);
  const uint64_t floorElems =
      std::min(capElems, std::max<uint64_t>(1, minWireBytes / std::max<size_t>(1, wireElemSize)));
  const uint64_t want = (shardElems + kChunksPerShard - 1) / kChunksPerShard;
  return std::clamp(want, floorElems, capElems) * elemSize;
}

std::vector<Chunk> splitChunks(uint64_t numel, size_t elemSize, uint64_t chunkBytes,
                               uint32_t firstIndex) {
  std::vector<Chunk> out;
  chunkBytes = effectiveChunkBytes(numel, elemSize, chunkBytes);
  uint64_t per = std::max<uint64_t>(1, chunkBytes / elemSize);
  uint64_t done = 0;
  uint32_t index = firstIndex;
  do {
    uint64_t cnt = std::min(per, numel - done);
    out.push_back({index++, done, cnt});
    done += cnt;
  } while (done < numel);
  return out;
}

}  // namespace smddp
