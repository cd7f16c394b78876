// Reduce-scatter, direct: rank r serves block r, receiving it from every
// other rank and combining in rank order (blocks.h), while it sends every
// other block to its owner.

#include "common/error.h"
#include "algorithms/blocks.h"

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
  serveReduction(ex, ctx, sig, static_cast<const uint8_t*>(ins[ctx.rank()].data),
                 static_cast<uint8_t*>(out.data), out.numel, remaining, chunks);
  for (int i = 1; i < n; ++i) {
    int p = (ctx.rank() + i) % n;
    sendBlock(ex, ctx, p, static_cast<const uint8_t*>(ins[p].data), out.numel, es);
  }
  ex.run();
}

}  // namespace smddp
