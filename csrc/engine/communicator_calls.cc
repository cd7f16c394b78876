// The Communicator's collective entry points: allreduce, which queues an
// AllreduceCall for the group's AllreducePath, its synchronous form, and
// enqueue, through which the algorithms queue every other collective
// (algorithms/collective_calls.h).
#include <condition_variable>
#include <mutex>

#include "common/caller_waiting.h"
#include "engine/communicator.h"

namespace smddp {

uint64_t Communicator::enqueue(const CollectiveSignature& sig, std::string what, Body body,
                               Done done, CallHooks hooks) {
  Task t;
  t.what = std::move(what);
  t.body = std::move(body);
  t.done = std::make_shared<CallDone>(std::move(done));
  t.sig = sig;
  return push(std::move(t), std::move(hooks));
}

uint64_t Communicator::allreduce(std::vector<Buffer> bufs, DataType dtype, ReduceOp op, Done done,
                                 CallHooks hooks) {
  if (hooks.touches.empty()) {
    const size_t es = elementSize(dtype);
    for (const auto& b : bufs) {
      auto p = reinterpret_cast<uintptr_t>(b.data);
      if (b.numel) hooks.touches.push_back({p, p + b.numel * es});
    }
  }
  auto call = std::make_shared<AllreduceCall>();
  call->bufs = std::move(bufs);
  call->dtype = dtype;
  call->op = op;
  for (const auto& b : call->bufs) call->numel += b.numel;
  const CollectiveSignature sig = call->signature();
  std::string why;
  if (!isSupported(op, dtype, &why)) {
    // Refused in call order on the engine thread, like any failed call:
    // the peers are told (no path sees it, none fuses it).
    const std::string text =
        std::string("allreduce: ") + toString(op) + " on " + toString(dtype) + ": " + why;
    return enqueue(sig, std::string(), [text](EngineContext&, uint64_t) {
      throwError(ErrorKind::kInvalidArgument, text);
    }, std::move(done), std::move(hooks));
  }
  Task t;
  t.allreduce = std::move(call);
  t.done = std::make_shared<CallDone>(std::move(done));
  t.sig = sig;
  return push(std::move(t), std::move(hooks));
}

void Communicator::allreduceSync(std::vector<Buffer> bufs, DataType dtype, ReduceOp op,
                                 std::vector<MemRange> touches) {
  observer_->direct();
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
