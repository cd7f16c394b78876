// The collectives' entry points (collective_calls.h): what each call
// queues. The signature names the call for stats' latency, the timeline
// and messages ("broadcast(float32, 1024 elements, root 0)").
#include "algorithms/collective_calls.h"

#include "algorithms/algorithms.h"

namespace smddp {

namespace {

CollectiveSignature sigOf(CollectiveType c, DataType dtype, uint64_t numel,
                          ReduceOp op = ReduceOp::kSum, int root = -1) {
  return CollectiveSignature{c, dtype, op, numel, root};
}

uint64_t total(const std::vector<Buffer>& bufs) {
  uint64_t n = 0;
  for (const auto& b : bufs) n += b.numel;
  return n;
}

}  // namespace

uint64_t broadcast(Communicator& comm, std::vector<Buffer> bufs, DataType dtype, int root,
                   Communicator::Done done, CallHooks hooks) {
  const CollectiveSignature sig =
      sigOf(CollectiveType::kBroadcast, dtype, total(bufs), ReduceOp::kSum, root);
  return comm.enqueue(sig, std::string(),
                      [bufs = std::move(bufs), dtype, root](EngineContext& ctx, uint64_t seq) {
                        runBroadcast(ctx, seq, bufs, dtype, root);
                      },
                      std::move(done), std::move(hooks));
}

uint64_t allgather(Communicator& comm, Buffer in, std::vector<Buffer> outs, DataType dtype,
                   Communicator::Done done, CallHooks hooks) {
  const CollectiveSignature sig = sigOf(CollectiveType::kAllgather, dtype, in.numel);
  return comm.enqueue(sig, std::string(),
                      [&comm, in, outs = std::move(outs), dtype](EngineContext& ctx, uint64_t seq) {
                        if (HostCollectives* host = comm.allreducePath().hostCollectivesFor(
                                CollectiveType::kAllgather)) {
                          host->allGather(ctx, seq, in, outs, dtype);
                        } else {
                          runAllgather(ctx, seq, in, outs, dtype);
                        }
                      },
                      std::move(done), std::move(hooks));
}

uint64_t barrier(Communicator& comm, Communicator::Done done) {
  return comm.enqueue(sigOf(CollectiveType::kBarrier, DataType::kUInt8, 0), "barrier",
                      [](EngineContext& ctx, uint64_t seq) { runBarrier(ctx, seq); },
                      std::move(done));
}

uint64_t monitoredBarrier(Communicator& comm, std::chrono::milliseconds timeout, Communicator::Done done) {
  return comm.enqueue(sigOf(CollectiveType::kBarrier, DataType::kUInt8, 0), "monitored_barrier",
                      [timeout](EngineContext& ctx, uint64_t seq) {
                        runMonitoredBarrier(ctx, seq, timeout);
                      },
                      std::move(done));
}

uint64_t reduceScatter(Communicator& comm, std::vector<Buffer> ins, Buffer out, DataType dtype,
                       ReduceOp op, Communicator::Done done, CallHooks hooks) {
  const CollectiveSignature sig = sigOf(CollectiveType::kReduceScatter, dtype, out.numel, op);
  return comm.enqueue(sig, std::string(),
                      [&comm, ins = std::move(ins), out, dtype, op](EngineContext& ctx,
                                                                   uint64_t seq) {
                        if (HostCollectives* host = comm.allreducePath().hostCollectivesFor(
                                CollectiveType::kReduceScatter)) {
                          host->reduceScatter(ctx, seq, ins, out, dtype, op);
                        } else {
                          runReduceScatter(ctx, seq, ins, out, dtype, op);
                        }
                      },
                      std::move(done), std::move(hooks));
}

uint64_t reduce(Communicator& comm, Buffer buf, DataType dtype, ReduceOp op, int root,
                Communicator::Done done, CallHooks hooks) {
  const CollectiveSignature sig = sigOf(CollectiveType::kReduce, dtype, buf.numel, op, root);
  return comm.enqueue(sig, std::string(),
                      [buf, dtype, op, root](EngineContext& ctx, uint64_t seq) {
                        runReduce(ctx, seq, buf, dtype, op, root);
                      },
                      std::move(done), std::move(hooks));
}

uint64_t gather(Communicator& comm, Buffer in, std::vector<Buffer> outs, DataType dtype,
                int root, Communicator::Done done, CallHooks hooks) {
  const CollectiveSignature sig =
      sigOf(CollectiveType::kGather, dtype, in.numel, ReduceOp::kSum, root);
  return comm.enqueue(sig, std::string(),
                      [in, outs = std::move(outs), dtype, root](EngineContext& ctx, uint64_t seq) {
                        runGather(ctx, seq, in, outs, dtype, root);
                      },
                      std::move(done), std::move(hooks));
}

uint64_t scatter(Communicator& comm, std::vector<Buffer> ins, Buffer out, DataType dtype,
                 int root, Communicator::Done done, CallHooks hooks) {
  const CollectiveSignature sig =
      sigOf(CollectiveType::kScatter, dtype, out.numel, ReduceOp::kSum, root);
  return comm.enqueue(sig, std::string(),
                      [ins = std::move(ins), out, dtype, root](EngineContext& ctx, uint64_t seq) {
                        runScatter(ctx, seq, ins, out, dtype, root);
                      },
                      std::move(done), std::move(hooks));
}

uint64_t alltoall(Communicator& comm, std::vector<Buffer> ins, std::vector<Buffer> outs,
                  DataType dtype, Communicator::Done done, CallHooks hooks) {
  const CollectiveSignature sig = sigOf(CollectiveType::kAlltoall, dtype, total(ins));
  return comm.enqueue(sig, std::string(),
                      [ins = std::move(ins), outs = std::move(outs), dtype](EngineContext& ctx,
                                                                            uint64_t seq) {
                        runAlltoall(ctx, seq, ins, outs, dtype);
                      },
                      std::move(done), std::move(hooks));
}

}  // namespace smddp
