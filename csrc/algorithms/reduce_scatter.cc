// Reduce-scatter, direct: rank r serves block r, receiving it from every
// other rank and combining in rank order (blocks.h), while it sends every
// other block to its owner.

#include "common/error.h"
#include "algorithms/blocks.h"
#include "algorithms/rounds.h"

namespace smddp {

void runReduceScatter(EngineContext& ctx, uint64_t seq, const std::vector<Buffer>& ins,
                      Buffer out, DataType dtype, ReduceOp op) {
  checkOp("reduce_scatter", op, dtype);
  const int n = ctx.size();
  const size_t es = elementSize(dtype);
  SMDDP_CHECK(static_cast<int>(ins.size()) == n, kInvalidArgument,
              "reduce_scatter needs one input block per rank");
  CollectiveSignature sig{CollectiveType::kReduceScatter, dtype, op, out.numel, -1};
  Exchange ex(ctx, seq, sig);
  std::vector<int> remaining;
  std::vector<Chunk> chunks;
  // This rank serves block `rank`; every other block goes to its owner.
  // Every rank its own host and a large call: pairwise rounds (rounds.h),
  // round i sending rank + i its block while rank - i's comes in.
  RoundSends sends(ctx, ex, roundsFor(ctx, out.numel * es * n), directChunkBytes(ctx));
  serveReduction(ex, ctx, sig, static_cast<const uint8_t*>(ins[ctx.rank()].data),
                 static_cast<uint8_t*>(out.data), out.numel, remaining, chunks, sends.onArrive());
  for (int i = 1; i < n; ++i) {
    const int p = (ctx.rank() + i) % n;
    const auto* src = static_cast<const uint8_t*>(ins[p].data);
    for (const Chunk& c : chunks) {
      sends.send(p, kPhaseToServer, c.index, c.elemOffset * es, src + c.elemOffset * es,
                 c.elemCount * es);
    }
  }
  ex.run();
}

}  // namespace smddp
