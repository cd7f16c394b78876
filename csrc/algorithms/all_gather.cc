// All-gather over the same Exchange machinery as allreduce: direct, every
// rank's buffer to every other rank, pipelined in chunks.

#include <cstring>

#include "common/error.h"
#include "algorithms/algorithms.h"
#include "engine/exchange.h"

namespace smddp {

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
  auto chunks = splitChunks(in.numel, es, directChunkBytes(ctx));
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
