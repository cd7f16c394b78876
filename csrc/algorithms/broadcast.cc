// Broadcast over the same Exchange machinery as allreduce: direct (at the
// world sizes of one host, <= 8 ranks, a direct pattern has the fewest
// steps), pipelined in chunks; several tensors go through the fusion
// buffer as one.

#include <cstring>

#include "algorithms/algorithms.h"
#include "engine/exchange.h"

namespace smddp {

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
    data = ctx.memory().fusionBuffer(total * es);
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

}  // namespace smddp
