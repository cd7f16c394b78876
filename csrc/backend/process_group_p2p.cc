// send / recv / recvAnysource and monitoredBarrier. Point-to-point calls do
// not consume the group's collective sequence and never block the engine's
// queue (see engine/p2p.cc), so isend/irecv rings cannot deadlock.
#include <future>

#include "backend/call_support.h"
#include "backend/device_collectives.h"
#include "backend/process_group.h"
#include "algorithms/collective_calls.h"

namespace c10d_smddp {

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::pointToPoint(std::vector<at::Tensor>& tensors,
                                                               int peer, int tag, bool isSend) {
  const char* name = isSend ? "send" : (peer < 0 ? "recv (any source)" : "recv");
  TORCH_CHECK_VALUE(tensors.size() == 1, "smddp ", name, " takes exactly one tensor, got ",
                    tensors.size());
  if (peer >= 0) {
    TORCH_CHECK_VALUE(peer < size_ && peer != rank_, "smddp ", name, ": invalid peer rank ", peer,
                      " (group size ", size_, ", this rank ", rank_, ")");
  }
  if (auto* dev = deviceFor(name, tensors)) {
    return track(dev->staged(
        isSend ? c10d::OpType::SEND : (peer < 0 ? c10d::OpType::RECVANYSOURCE : c10d::OpType::RECV),
        name, tensors,
        [&](DeviceStage& s) -> DeviceCollectives::HostCall {
          auto h = s.map(tensors, isSend, !isSend);
          return [h, peer, tag, isSend](ProcessGroupSmddp& pg) mutable {
            return pg.pointToPoint(h, peer, tag, isSend);
          };
        },
        isSend ? DeviceCollectives::Lane::kSend : DeviceCollectives::Lane::kRecv,
        /*syncOnWait=*/false, peer));
  }
  checkTensor(tensors[0], name);
  DataType dt = toMovedDataType(tensors[0], name);
  if (checkingOnly()) return {};
  Staging staging;
  // A send's staging copy is filled on the worker just before it is posted,
  // after the collectives queued before it (call order); a receive's is
  // copied back when it completes.
  Buffer b = bufferOf(staging.stage(tensors[0], isSend ? Use::kIn : Use::kOut));
  auto work = c10::make_intrusive<WorkSmddp>(
      rank_, isSend ? c10d::OpType::SEND : (peer < 0 ? c10d::OpType::RECVANYSOURCE : c10d::OpType::RECV),
      isSend ? "smddp:send" : "smddp:recv", tensors, tensors);
  work->setFinisher(staging.finisher(0));
  auto keep = std::make_shared<std::vector<at::Tensor>>(staging.work);
  auto done = [work, keep, errors = asyncError_](std::exception_ptr e, int src) {
    if (e) errors->note(e);
    work->setSourceRank(src);
    work->complete(e);
  };
  try {
    if (isSend) comm_->send(b, dt, peer, tag, done, smddp::CallHooks{{}, staging.preparer(0)});
    else comm_->recv(b, dt, peer, tag, done);
  } catch (const smddp::Error& e) {
    if (e.kind() == smddp::ErrorKind::kInvalidArgument) TORCH_CHECK_VALUE(false, e.what());
    rethrowAsTorch(e);
  }
  return track(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::send(std::vector<at::Tensor>& tensors,
                                                       int dstRank, int tag) {
  return pointToPoint(tensors, dstRank, tag, true);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::recv(std::vector<at::Tensor>& tensors,
                                                       int srcRank, int tag) {
  return pointToPoint(tensors, srcRank, tag, false);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::recvAnysource(std::vector<at::Tensor>& tensors,
                                                                int tag) {
  return pointToPoint(tensors, -1, tag, false);
}

void ProcessGroupSmddp::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  auto timeout = opts.timeout.count() > 0 ? opts.timeout : std::chrono::milliseconds(0);
  std::promise<void> p;
  auto f = p.get_future();
  try {
    smddp::monitoredBarrier(*comm_, timeout, [&p](std::exception_ptr e) {
      if (e) p.set_exception(e);
      else p.set_value();
    });
    f.get();
  } catch (const smddp::Error& e) {
    rethrowAsTorch(e);
  }
}

}  // namespace c10d_smddp
