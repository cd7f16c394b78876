// Barriers: a zero-byte allreduce through one reduction server, which
// releases every rank once all have checked in (allreduce.cc's core).

#include "algorithms/algorithms.h"

namespace smddp {

void runBarrier(EngineContext& ctx, uint64_t seq) {
  // A zero-byte allreduce: everyone checks in with one server, which
  // releases everyone once all have arrived.
  CollectiveSignature sig{CollectiveType::kBarrier, DataType::kUInt8, ReduceOp::kSum, 0, -1};
  checkInWithServer(ctx, seq, sig, seq, ctx.waits().timeout());
}

void runMonitoredBarrier(EngineContext& ctx, uint64_t seq, std::chrono::milliseconds timeout) {
  CollectiveSignature sig{CollectiveType::kBarrier, DataType::kUInt8, ReduceOp::kSum, 0, 0};
  checkInWithServer(ctx, seq, sig, /*planSeq: server 0*/ 0, timeout);
}

}  // namespace smddp
