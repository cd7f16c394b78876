// The collectives other than allreduce, as callers make them: each queues
// its algorithm (algorithms.h) on the group's Communicator, which gives it
// the next sequence number and runs it on its engine thread. Allreduce is
// the Communicator's own (Communicator::allreduce), since its path may
// fuse queued calls.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "common/dtype.h"
#include "engine/call.h"
#include "engine/communicator.h"

namespace smddp {

// Buffers must stay valid until `done` runs. Each returns the sequence
// number the call was given.
uint64_t broadcast(Communicator& comm, std::vector<Buffer> bufs, DataType dtype, int root,
                   Communicator::Done done, CallHooks hooks = {});
// outs[r] receives rank r's `in`; outs[rank] may alias `in`.
uint64_t allgather(Communicator& comm, Buffer in, std::vector<Buffer> outs, DataType dtype,
                   Communicator::Done done, CallHooks hooks = {});
uint64_t barrier(Communicator& comm, Communicator::Done done);
// A barrier whose server is rank 0, so a timeout names every missing rank.
uint64_t monitoredBarrier(Communicator& comm, std::chrono::milliseconds timeout, Communicator::Done done);
// ins[r] is the block destined for rank r; `out` receives this rank's reduced block.
uint64_t reduceScatter(Communicator& comm, std::vector<Buffer> ins, Buffer out, DataType dtype,
                       ReduceOp op, Communicator::Done done, CallHooks hooks = {});
uint64_t reduce(Communicator& comm, Buffer buf, DataType dtype, ReduceOp op, int root,
                Communicator::Done done, CallHooks hooks = {});
uint64_t gather(Communicator& comm, Buffer in, std::vector<Buffer> outs, DataType dtype,
                int root, Communicator::Done done, CallHooks hooks = {});
uint64_t scatter(Communicator& comm, std::vector<Buffer> ins, Buffer out, DataType dtype,
                 int root, Communicator::Done done, CallHooks hooks = {});
// ins[r] goes to rank r, outs[r] comes from rank r (sizes may differ).
uint64_t alltoall(Communicator& comm, std::vector<Buffer> ins, std::vector<Buffer> outs,
                  DataType dtype, Communicator::Done done, CallHooks hooks = {});

}  // namespace smddp
