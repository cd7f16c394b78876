// The Communicator's collective entry points: each queues its algorithm
// (algorithms.h) with the caller's completion; allreduce also offers itself
// to the fusion-buffer scheduler when the host path is open.
#include <condition_variable>
#include <mutex>

#include "common/caller_waiting.h"
#include "algorithms/algorithms.h"
#include "engine/communicator.h"
#include "hostpath/fusion_scheduler.h"

namespace smddp {

namespace {

// What a call is: its signature (stats' latency, the timeline) and, from
// it, its text for messages and the debug log ("allreduce(SUM, float32,
// 1024 elements)").
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

uint64_t Communicator::allreduce(std::vector<Buffer> bufs, DataType dtype, ReduceOp op, Done done,
                                 CallHooks hooks) {
  if (hooks.touches.empty()) {
    const size_t es = elementSize(dtype);
    for (const auto& b : bufs) {
      auto p = reinterpret_cast<uintptr_t>(b.data);
      if (b.numel) hooks.touches.push_back({p, p + b.numel * es});
    }
  }
  if (fuses() && isSupported(op, dtype)) {
    // Unsupported combinations take the plain path, which reports them.
    // Fusible calls have no body: the host scheduler or the network
    // batch (runTasks) runs them from the FusibleCall.
    auto fusible = std::make_shared<FusibleCall>();
    fusible->bufs = std::move(bufs);
    fusible->dtype = dtype;
    fusible->op = op;
    for (const auto& b : fusible->bufs) fusible->numel += b.numel;
    const CollectiveSignature sig = sigOf(CollectiveType::kAllreduce, dtype, fusible->numel, op);
    return enqueue(sig, std::string(), nullptr, std::move(done), std::move(fusible),
                   std::move(hooks));
  }
  const CollectiveSignature sig = sigOf(CollectiveType::kAllreduce, dtype, total(bufs), op);
  return enqueue(sig, std::string(), [this, bufs = std::move(bufs), dtype, op](uint64_t seq) {
    runAllreduce(*this, seq, bufs, dtype, op);
  }, std::move(done), nullptr, std::move(hooks));
}

uint64_t Communicator::broadcast(std::vector<Buffer> bufs, DataType dtype, int root, Done done,
                                 CallHooks hooks) {
  const CollectiveSignature sig =
      sigOf(CollectiveType::kBroadcast, dtype, total(bufs), ReduceOp::kSum, root);
  return enqueue(sig, std::string(), [this, bufs = std::move(bufs), dtype, root](uint64_t seq) {
    runBroadcast(*this, seq, bufs, dtype, root);
  }, std::move(done), nullptr, std::move(hooks));
}

uint64_t Communicator::allgather(Buffer in, std::vector<Buffer> outs, DataType dtype, Done done,
                                 CallHooks hooks) {
  const CollectiveSignature sig = sigOf(CollectiveType::kAllgather, dtype, in.numel);
  return enqueue(sig, std::string(), [this, in, outs = std::move(outs), dtype](uint64_t seq) {
    runAllgather(*this, seq, in, outs, dtype);
  }, std::move(done), nullptr, std::move(hooks));
}

uint64_t Communicator::barrier(Done done) {
  return enqueue(sigOf(CollectiveType::kBarrier, DataType::kUInt8, 0), "barrier",
                 [this](uint64_t seq) { runBarrier(*this, seq); }, std::move(done));
}

uint64_t Communicator::monitoredBarrier(std::chrono::milliseconds timeout, Done done) {
  return enqueue(sigOf(CollectiveType::kBarrier, DataType::kUInt8, 0), "monitored_barrier",
                 [this, timeout](uint64_t seq) {
    runMonitoredBarrier(*this, seq, timeout);
  }, std::move(done));
}

uint64_t Communicator::reduceScatter(std::vector<Buffer> ins, Buffer out, DataType dtype,
                                     ReduceOp op, Done done, CallHooks hooks) {
  const CollectiveSignature sig = sigOf(CollectiveType::kReduceScatter, dtype, out.numel, op);
  return enqueue(sig, std::string(), [this, ins = std::move(ins), out, dtype, op](uint64_t seq) {
    runReduceScatter(*this, seq, ins, out, dtype, op);
  }, std::move(done), nullptr, std::move(hooks));
}

uint64_t Communicator::reduce(Buffer buf, DataType dtype, ReduceOp op, int root, Done done,
                              CallHooks hooks) {
  const CollectiveSignature sig = sigOf(CollectiveType::kReduce, dtype, buf.numel, op, root);
  return enqueue(sig, std::string(), [this, buf, dtype, op, root](uint64_t seq) {
    runReduce(*this, seq, buf, dtype, op, root);
  }, std::move(done), nullptr, std::move(hooks));
}

uint64_t Communicator::gather(Buffer in, std::vector<Buffer> outs, DataType dtype, int root,
                              Done done, CallHooks hooks) {
  const CollectiveSignature sig = sigOf(CollectiveType::kGather, dtype, in.numel, ReduceOp::kSum, root);
  return enqueue(sig, std::string(),
                 [this, in, outs = std::move(outs), dtype, root](uint64_t seq) {
    runGather(*this, seq, in, outs, dtype, root);
  }, std::move(done), nullptr, std::move(hooks));
}

uint64_t Communicator::scatter(std::vector<Buffer> ins, Buffer out, DataType dtype, int root,
                               Done done, CallHooks hooks) {
  const CollectiveSignature sig = sigOf(CollectiveType::kScatter, dtype, out.numel, ReduceOp::kSum, root);
  return enqueue(sig, std::string(),
                 [this, ins = std::move(ins), out, dtype, root](uint64_t seq) {
    runScatter(*this, seq, ins, out, dtype, root);
  }, std::move(done), nullptr, std::move(hooks));
}

uint64_t Communicator::alltoall(std::vector<Buffer> ins, std::vector<Buffer> outs,
                                DataType dtype, Done done, CallHooks hooks) {
  const CollectiveSignature sig = sigOf(CollectiveType::kAlltoall, dtype, total(ins));
  return enqueue(sig, std::string(), [this, ins = std::move(ins), outs = std::move(outs),
                              dtype](uint64_t seq) { runAlltoall(*this, seq, ins, outs, dtype); },
                 std::move(done), nullptr, std::move(hooks));
}

void Communicator::allreduceSync(std::vector<Buffer> bufs, DataType dtype, ReduceOp op,
                                 std::vector<MemRange> touches) {
  // Usually done before allreduce() returns (run on this thread); on the
  // stack, where a std::promise would allocate its shared state per call.
  struct Outcome {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::exception_ptr error;
  } out;
  CallHooks hooks;
  hooks.touches = std::move(touches);
  hooks.callerWaits = true;
  allreduce(std::move(bufs), dtype, op, [&out](std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(out.mu);
    out.error = e;
    out.done = true;
    out.cv.notify_all();
  }, std::move(hooks));
  CallerWaiting waiting;
  std::unique_lock<std::mutex> lock(out.mu);
  out.cv.wait(lock, [&] { return out.done; });
  if (out.error) std::rethrow_exception(out.error);
}

}  // namespace smddp
