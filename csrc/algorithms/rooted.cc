// The rooted collectives, direct, on the block exchanges of blocks.h:
// reduce (the root serves the whole buffer), gather and scatter.

#include <cstring>

#include "common/error.h"
#include "algorithms/blocks.h"

namespace smddp {

void runReduce(EngineContext& ctx, uint64_t seq, Buffer buf, DataType dtype, ReduceOp op,
               int root) {
  checkOp("reduce", op, dtype);
  const size_t es = elementSize(dtype);
  CollectiveSignature sig{CollectiveType::kReduce, dtype, op, buf.numel, root};
  if (ctx.size() == 1) return;
  Exchange ex(ctx, seq, sig);
  std::vector<int> remaining;
  std::vector<Chunk> chunks;
  auto* data = static_cast<uint8_t*>(buf.data);
  if (ctx.rank() == root) {
    serveReduction(ex, ctx, sig, data, data, buf.numel, remaining, chunks);
  } else {
    sendBlock(ex, ctx, root, data, buf.numel, es);
  }
  ex.run();
}

void runGather(EngineContext& ctx, uint64_t seq, Buffer in, const std::vector<Buffer>& outs,
               DataType dtype, int root) {
  const size_t es = elementSize(dtype);
  CollectiveSignature sig{CollectiveType::kGather, dtype, ReduceOp::kSum, in.numel, root};
  if (ctx.rank() == root) {
    SMDDP_CHECK(static_cast<int>(outs.size()) == ctx.size(), kInvalidArgument,
                "gather needs one output per rank on the root");
    if (in.numel && outs[root].data != in.data) std::memmove(outs[root].data, in.data, in.numel * es);
  }
  if (ctx.size() == 1) return;
  Exchange ex(ctx, seq, sig);
  if (ctx.rank() == root) {
    for (int p = 0; p < ctx.size(); ++p) {
      if (p != root) recvBlock(ex, ctx, p, static_cast<uint8_t*>(outs[p].data), in.numel, es);
    }
  } else {
    sendBlock(ex, ctx, root, static_cast<const uint8_t*>(in.data), in.numel, es);
  }
  ex.run();
}

void runScatter(EngineContext& ctx, uint64_t seq, const std::vector<Buffer>& ins, Buffer out,
                DataType dtype, int root) {
  const size_t es = elementSize(dtype);
  CollectiveSignature sig{CollectiveType::kScatter, dtype, ReduceOp::kSum, out.numel, root};
  if (ctx.rank() == root) {
    SMDDP_CHECK(static_cast<int>(ins.size()) == ctx.size(), kInvalidArgument,
                "scatter needs one input per rank on the root");
    if (out.numel && ins[root].data != out.data) std::memmove(out.data, ins[root].data, out.numel * es);
  }
  if (ctx.size() == 1) return;
  Exchange ex(ctx, seq, sig);
  if (ctx.rank() == root) {
    for (int i = 1; i < ctx.size(); ++i) {
      int p = (root + i) % ctx.size();
      sendBlock(ex, ctx, p, static_cast<const uint8_t*>(ins[p].data), out.numel, es);
    }
  } else {
    recvBlock(ex, ctx, root, static_cast<uint8_t*>(out.data), out.numel, es);
  }
  ex.run();
}

}  // namespace smddp
