// All-to-all, direct: every rank sends block r to rank r and receives
// block r from it (sizes may differ per pair).

#include <cstring>

#include "common/error.h"
#include "algorithms/blocks.h"

namespace smddp {

void runAlltoall(EngineContext& ctx, uint64_t seq, const std::vector<Buffer>& ins,
                 const std::vector<Buffer>& outs, DataType dtype) {
  const int n = ctx.size();
  const int rank = ctx.rank();
  const size_t es = elementSize(dtype);
  SMDDP_CHECK(static_cast<int>(ins.size()) == n && static_cast<int>(outs.size()) == n,
              kInvalidArgument, "alltoall needs one input and one output per rank");
  // Split sizes may differ per pair, so the signature carries no count;
  // every frame's exact length is still checked against the receive.
  CollectiveSignature sig{CollectiveType::kAlltoall, dtype, ReduceOp::kSum, 0, -1};
  SMDDP_CHECK(ins[rank].numel == outs[rank].numel, kInvalidArgument,
              "alltoall: this rank sends itself " + std::to_string(ins[rank].numel) +
                  " elements but expects " + std::to_string(outs[rank].numel));
  if (ins[rank].numel && ins[rank].data != outs[rank].data) {
    std::memmove(outs[rank].data, ins[rank].data, ins[rank].numel * es);
  }
  if (n == 1) return;
  Exchange ex(ctx, seq, sig);
  for (int i = 1; i < n; ++i) {
    int p = (rank + n - i) % n;
    recvBlock(ex, ctx, p, static_cast<uint8_t*>(outs[p].data), outs[p].numel, es);
  }
  for (int i = 1; i < n; ++i) {
    int p = (rank + i) % n;
    sendBlock(ex, ctx, p, static_cast<const uint8_t*>(ins[p].data), ins[p].numel, es);
  }
  ex.run();
}

}  // namespace smddp
