// All-gather over the same Exchange machinery as allreduce: direct, every
// rank's buffer to every other rank, pipelined in chunks; in pairwise
// rounds for large calls between many hosts (rounds.h).

#include <cstring>

#include "common/error.h"
#include "algorithms/algorithms.h"
#include "algorithms/rounds.h"
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
  const int rank = ctx.rank();
  // Every rank its own host and a large call: pairwise rounds (rounds.h),
  // round r to rank + r while rank - r's part comes in.
  RoundSends sends(ctx, ex, roundsFor(ctx, in.numel * es * n), directChunkBytes(ctx));
  // Receive every peer's buffer into its slot, then send ours to everyone.
  for (int r = 1; r < n; ++r) {
    const int p = (rank - r + n) % n;
    auto* dst = static_cast<uint8_t*>(outs[p].data);
    for (const Chunk& c : chunks) {
      ex.recv(p, kPhaseToServer, c.index, dst + c.elemOffset * es, c.elemCount * es,
              sends.onArrive());
    }
  }
  const auto* src = static_cast<const uint8_t*>(in.data);
  for (int r = 1; r < n; ++r) {
    const int p = (rank + r) % n;
    for (const Chunk& c : chunks) {
      sends.send(p, kPhaseToServer, c.index, c.elemOffset * es, src + c.elemOffset * es,
                 c.elemCount * es);
    }
  }
  ex.run();
}

}  // namespace smddp
