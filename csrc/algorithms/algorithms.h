// The collective algorithms the Communicator's worker thread runs. Each is
// a plain function over an Exchange; all of them block (bounded by the group
// timeout) and throw smddp::Error on failure.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "engine/communicator.h"
#include "reduce/shard_plan.h"

namespace smddp {

// Reduction servers: shard i of every rank's buffer goes to server i, which
// combines the shards in rank order and sends the result back to all.
void runAllreduce(Communicator& comm, uint64_t seq, const std::vector<Buffer>& bufs,
                  DataType dtype, ReduceOp op);
// Posts more messages in the same Exchange as an allreduce's data (network
// fusion's cut proposals), so they cost no round trip of their own.
class Exchange;
using ExtraMessages = std::function<void(Exchange&)>;
// runAllreduce without the argument check and the stats: `bufs` reduced as
// one buffer (through the fusion buffer when several), `extra` riding along.
void allreduceBuffers(Communicator& comm, uint64_t seq, const std::vector<Buffer>& bufs,
                      DataType dtype, ReduceOp op, const ExtraMessages& extra);
void runBroadcast(Communicator& comm, uint64_t seq, const std::vector<Buffer>& bufs,
                  DataType dtype, int root);
void runAllgather(Communicator& comm, uint64_t seq, Buffer in, const std::vector<Buffer>& outs,
                  DataType dtype);
void runBarrier(Communicator& comm, uint64_t seq);
// A barrier served by rank 0 with its own timeout: rank 0's error names
// every rank that had not arrived.
void runMonitoredBarrier(Communicator& comm, uint64_t seq, std::chrono::milliseconds timeout);
// ins[r] is the block destined for rank r; out receives this rank's reduced block.
void runReduceScatter(Communicator& comm, uint64_t seq, const std::vector<Buffer>& ins,
                      Buffer out, DataType dtype, ReduceOp op);
void runReduce(Communicator& comm, uint64_t seq, Buffer buf, DataType dtype, ReduceOp op,
               int root);
void runGather(Communicator& comm, uint64_t seq, Buffer in, const std::vector<Buffer>& outs,
               DataType dtype, int root);
void runScatter(Communicator& comm, uint64_t seq, const std::vector<Buffer>& ins, Buffer out,
                DataType dtype, int root);
// ins[r] goes to rank r, outs[r] comes from rank r (sizes may differ).
void runAlltoall(Communicator& comm, uint64_t seq, const std::vector<Buffer>& ins,
                 const std::vector<Buffer>& outs, DataType dtype);

// At most this many chunks per peer stream: providers hold a bounded number
// of posted and unexpected messages (shm stalls past ~1000 outstanding), so
// a huge call uses bigger chunks rather than more of them.
constexpr uint64_t kMaxChunksPerStream = 128;
uint64_t effectiveChunkBytes(uint64_t numel, size_t elemSize, uint64_t chunkBytes);

// Cuts [0, numel) into chunks of at most chunkBytes (at least one chunk,
// possibly empty), numbering them from `firstIndex`.
std::vector<Chunk> splitChunks(uint64_t numel, size_t elemSize, uint64_t chunkBytes,
                               uint32_t firstIndex = 0);

}  // namespace smddp
