// The collective algorithms the engine thread runs, over the group's
// context (engine/engine_context.h). Each is a plain function over an
// Exchange; all of them block (bounded by the group timeout) and throw
// smddp::Error on failure. collective_calls.h queues them.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "engine/allreduce_path.h"
#include "engine/call.h"
#include "engine/engine_config.h"
#include "engine/engine_context.h"
#include "reduce/shard_plan.h"

namespace smddp {

// The network path's parameters (allreduce.cc): shards and the receive ring.
void readAllreduceParams(EngineConfig& c);

// What the network-only allreduce paths share: allreduce over libfabric
// through the reduction servers below, and the group's description (why
// allreduce stays on the network, servers, chunk, ring depth, fusion).
class NetworkPath : public AllreducePath {
 public:
  CallPath callPath() const override { return CallPath::kNetwork; }
  std::string describe() const override;
  int reductionServers() const override {
    return static_cast<int>(ctx_.peers().networkServers().size());
  }

 protected:
  NetworkPath(EngineContext& ctx, std::string why) : ctx_(ctx), why_(std::move(why)) {}
  EngineContext& ctx_;
  const std::string why_;
};

// The plain network allreduce as the group's allreduce path: every call
// alone (no fusion). `why` says why allreduce stays on the network.
std::unique_ptr<AllreducePath> openNetworkAllreduce(EngineContext& ctx, std::string why);

// Reduction servers: shard i of every rank's buffer goes to server i, which
// combines the shards in rank order and sends the result back to all. The
// engine has checked op and dtype (Communicator::allreduce).
void runAllreduce(EngineContext& ctx, uint64_t seq, const std::vector<Buffer>& bufs,
                  DataType dtype, ReduceOp op);
// Posts more messages in the same Exchange as an allreduce's data (network
// fusion's cut proposals), so they cost no round trip of their own.
class Exchange;
using ExtraMessages = std::function<void(Exchange&)>;
// runAllreduce without the stats: `bufs` reduced as one buffer (through
// the fusion buffer when several), `extra` riding along.
void allreduceBuffers(EngineContext& ctx, uint64_t seq, const std::vector<Buffer>& bufs,
                      DataType dtype, ReduceOp op, const ExtraMessages& extra);
// Whether allreduceBuffers sends this call in SMDDP_CROSS_HOST_DTYPE's
// narrow wire form: f32 SUM or AVG, in a group with one rank per host (the
// network-only path then carries only what crosses hosts).
bool narrowsOnNetwork(const EngineContext& ctx, DataType dtype, ReduceOp op);
void runBroadcast(EngineContext& ctx, uint64_t seq, const std::vector<Buffer>& bufs,
                  DataType dtype, int root);
void runAllgather(EngineContext& ctx, uint64_t seq, Buffer in, const std::vector<Buffer>& outs,
                  DataType dtype);
// The reduction servers' core with no data (allreduce.cc): every rank
// checks in with server planSeq mod the servers, which answers once all
// have, within `timeout` (barrier.cc).
void checkInWithServer(EngineContext& ctx, uint64_t seq, const CollectiveSignature& sig,
                       uint64_t planSeq, std::chrono::milliseconds timeout);
void runBarrier(EngineContext& ctx, uint64_t seq);
// A barrier served by rank 0 with its own timeout: rank 0's error names
// every rank that had not arrived.
void runMonitoredBarrier(EngineContext& ctx, uint64_t seq, std::chrono::milliseconds timeout);
// ins[r] is the block destined for rank r; out receives this rank's reduced block.
void runReduceScatter(EngineContext& ctx, uint64_t seq, const std::vector<Buffer>& ins,
                      Buffer out, DataType dtype, ReduceOp op);
void runReduce(EngineContext& ctx, uint64_t seq, Buffer buf, DataType dtype, ReduceOp op,
               int root);
void runGather(EngineContext& ctx, uint64_t seq, Buffer in, const std::vector<Buffer>& outs,
               DataType dtype, int root);
void runScatter(EngineContext& ctx, uint64_t seq, const std::vector<Buffer>& ins, Buffer out,
                DataType dtype, int root);
// ins[r] goes to rank r, outs[r] comes from rank r (sizes may differ).
void runAlltoall(EngineContext& ctx, uint64_t seq, const std::vector<Buffer>& ins,
                 const std::vector<Buffer>& outs, DataType dtype);

// At most this many chunks per peer stream: providers hold a bounded number
// of posted and unexpected messages (shm stalls past ~1000 outstanding), so
// a huge call uses bigger chunks rather than more of them.
constexpr uint64_t kMaxChunksPerStream = 128;
uint64_t effectiveChunkBytes(uint64_t numel, size_t elemSize, uint64_t chunkBytes);

// A shard's chunks pipeline its sends, reductions and results; a shard of
// only a few chunks spends much of its time filling and draining that
// pipeline (7 hosts x 1 rank at 2 Gbit/s, 4 MiB: 66-69% of the link bound
// with 256 KiB chunks, 99% with 128 KiB; docs/notes). So a shard short of
// kChunksPerShard chunks of `chunkBytes` gets smaller ones, down to
// `minWireBytes` on the wire (an element takes `wireElemSize` there: a
// narrow wire form's chunks stay as they were, since 64 KiB messages made
// bf16 crossing slower). Returns the chunk's size in elements of
// `elemSize` bytes, as bytes; effectiveChunkBytes still applies.
constexpr uint64_t kChunksPerShard = 16;
uint64_t shardChunkBytes(uint64_t shardElems, size_t elemSize, size_t wireElemSize,
                         uint64_t chunkBytes, uint64_t minWireBytes);

// The chunk of a direct exchange (the direct collectives, the hierarchy's
// crossing): SMDDP_CHUNK_BYTES, within rxm's eager limit, header included
// (kEagerPayloadBytes, common/wire_limits.h).
uint64_t directChunkBytes(const EngineContext& ctx);

// Cuts [0, numel) into chunks of at most chunkBytes (at least one chunk,
// possibly empty), numbering them from `firstIndex`.
std::vector<Chunk> splitChunks(uint64_t numel, size_t elemSize, uint64_t chunkBytes,
                               uint32_t firstIndex = 0);

}  // namespace smddp
