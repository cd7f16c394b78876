// Broadcast and allgather over the same Exchange machinery as allreduce.
// Both are direct: at the world sizes of one host (<= 8 ranks) a direct
// pattern has the fewest steps; large payloads are pipelined in chunks.

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "algorithms/algorithms.h"
#include "engine/exchange.h"

namespace smddp {

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

void runBroadcast(EngineContext& ctx, uint64_t seq, const std::vector<Buffer>& bufs,
                  DataType dtype, int root) {
  const size_t es = elementSize(dtype);
  uint64_t total = 0;
  for (const auto& b : bufs) total += b.numel;
  CollectiveSignature sig{CollectiveType::kBroadcast, dtype, ReduceOp::kSum, total, root};
  if (ctx.size() == 1) return;
  uint8_t* data = static_cast<uint8_t*>(bufs.empty() ? nullptr : bufs[0].data);
  bool fused = bufs.size() > 1;
  if (fused) {
    data = ctx.fusionBuffer(total * es);
    if (ctx.rank() == root) {
      uint64_t off = 0;
      for (const auto& b : bufs) {
        if (b.numel) std::memcpy(data + off * es, b.data, b.numel * es);
        off += b.numel;
      }
    }
  }
  Exchange ex(ctx, seq, sig);
  auto chunks = splitChunks(total, es, ctx.config().chunkBytes);
  if (ctx.rank() == root) {
    // Root: send every chunk to every other rank.
    for (const Chunk& c : chunks) {
      for (int p = 0; p < ctx.size(); ++p) {
        if (p != root) {
          ex.send(p, kPhaseToServer, c.index, c.elemOffset * es, data + c.elemOffset * es,
                  c.elemCount * es);
        }
      }
    }
  } else {
    // Others: receive every chunk from the root, in place.
    for (const Chunk& c : chunks) {
      ex.recv(root, kPhaseToServer, c.index, data + c.elemOffset * es, c.elemCount * es);
    }
  }
  ex.run();
  if (fused && ctx.rank() != root) {
    uint64_t off = 0;
    for (const auto& b : bufs) {
      if (b.numel) std::memcpy(b.data, data + off * es, b.numel * es);
      off += b.numel;
    }
  }
}

void runAllgather(EngineContext& ctx, uint64_t seq, Buffer in, const std::vector<Buffer>& outs,
                  DataType dtype) {
  const size_t es = elementSize(dtype);
  const int n = ctx.size();
  SMDDP_CHECK(static_cast<int>(outs.size()) == n, kInvalidArgument,
              "allgather needs one output per rank");
  CollectiveSignature sig{CollectiveType::kAllgather, dtype, ReduceOp::kSum, in.numel, -1};
  if (in.numel && outs[ctx.rank()].data != in.data) {
    std::memmove(outs[ctx.rank()].data, in.data, in.numel * es);
  }
  if (n == 1) return;
  Exchange ex(ctx, seq, sig);
  auto chunks = splitChunks(in.numel, es, ctx.config().chunkBytes);
  // Receive every peer's buffer into its slot, then send ours to everyone.
  for (int p = 0; p < n; ++p) {
    if (p == ctx.rank()) continue;
    auto* dst = static_cast<uint8_t*>(outs[p].data);
    for (const Chunk& c : chunks) {
      ex.recv(p, kPhaseToServer, c.index, dst + c.elemOffset * es, c.elemCount * es);
    }
  }
  const auto* src = static_cast<const uint8_t*>(in.data);
  for (int p = 0; p < n; ++p) {
    if (p == ctx.rank()) continue;
    for (const Chunk& c : chunks) {
      ex.send(p, kPhaseToServer, c.index, c.elemOffset * es, src + c.elemOffset * es,
              c.elemCount * es);
    }
  }
  ex.run();
}

}  // namespace smddp
