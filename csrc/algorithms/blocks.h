// The block exchanges the direct collectives share (reduce_scatter.cc,
// rooted.cc, all_to_all.cc): a reducing rank ("server") receives each
// peer's block chunk by chunk into scratch and combines the blocks in rank
// order as soon as a chunk is complete, so the result is bitwise the same
// as allreduce's for the same inputs; a worker sends or receives a block
// in chunks.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "algorithms/algorithms.h"
#include "engine/exchange.h"

namespace smddp {

// Server half: receive `count` elements from every other rank and reduce
// them with `own` (this rank's contribution) into `out`, in rank order.
// `remaining` and `chunks` must outlive the Exchange's run(); `onArrive`
// (if set) runs as each chunk of each peer arrives (RoundSends' clock).
// Receives post in round order: from rank - 1 first.
void serveReduction(Exchange& ex, EngineContext& ctx, CollectiveSignature sig,
                    const uint8_t* own, uint8_t* out, uint64_t count, std::vector<int>& remaining,
                    std::vector<Chunk>& chunks, const std::function<void()>& onArrive = nullptr);
// Worker half: send `count` elements at `src` to `server`, chunked.
void sendBlock(Exchange& ex, EngineContext& ctx, int server, const uint8_t* src, uint64_t count,
               size_t es, uint32_t phase = kPhaseToServer);
// Receive `count` elements from `from` into `dst`, chunked.
void recvBlock(Exchange& ex, EngineContext& ctx, int from, uint8_t* dst, uint64_t count,
               size_t es, uint32_t phase = kPhaseToServer);
// Throws kInvalidArgument naming `what`, the op and the dtype when the op
// cannot reduce that dtype.
void checkOp(const char* what, ReduceOp op, DataType dtype);

}  // namespace smddp
