#include "backend/process_group.h"

#include <c10/util/Exception.h>

#include "backend/call_support.h"
#include "backend/store_bootstrap.h"
#include "backend/work.h"
#include "common/error.h"

namespace c10d_smddp {


ProcessGroupSmddp::ProcessGroupSmddp(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                     int size, std::chrono::milliseconds timeout,
                                     std::string groupName)
    : c10d::Backend(rank, size), groupName_(std::move(groupName)) {
  StoreBootstrap boot(store);
  smddp::CommOptions opts;
  opts.rank = rank;
  opts.size = size;
  opts.timeout = timeout;
  opts.name = groupName_;
  try {
    comm_ = std::make_unique<smddp::Communicator>(boot, opts);
    WorkSmddp::setDefaultSpin(std::chrono::microseconds(comm_->config().spinUs));
  } catch (const smddp::Error& e) {
    if (e.kind() == smddp::ErrorKind::kInvalidArgument) TORCH_CHECK_VALUE(false, e.what());
    rethrowAsTorch(e);
  }
}

ProcessGroupSmddp::~ProcessGroupSmddp() { shutdown(); }

void ProcessGroupSmddp::shutdown() {
  if (comm_) comm_->shutdown();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::track(c10::intrusive_ptr<c10d::Work> work) {
  std::lock_guard<std::mutex> lock(coalesceMu_);
  if (coalescing_) coalesced_.push_back(work);
  return work;
}

void ProcessGroupSmddp::startCoalescing() {
  std::lock_guard<std::mutex> lock(coalesceMu_);
  TORCH_CHECK(!coalescing_, "smddp startCoalescing: a coalescing block is already open on group ",
              groupName_, " (nested coalescing is not supported)");
  coalescing_ = true;
  coalesced_.clear();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::endCoalescing() {
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  {
    std::lock_guard<std::mutex> lock(coalesceMu_);
    TORCH_CHECK(coalescing_, "smddp endCoalescing: no coalescing block is open on group ",
                groupName_);
    coalescing_ = false;
    works.swap(coalesced_);
  }
  std::vector<at::Tensor> outputs;
  for (const auto& w : works) {
    for (auto& t : w->result()) outputs.push_back(t);
  }
  auto work = c10::make_intrusive<WorkSmddp>(rank_, c10d::OpType::COALESCED, "smddp:coalesced",
                                             outputs, std::vector<at::Tensor>{});
  if (!works.empty()) work->setSequence(works.back()->getSequencenumber());
  if (works.empty()) {
    work->complete(nullptr);
    return work;
  }
  auto countdown = std::make_shared<Countdown>(work, static_cast<int>(works.size()));
  for (const auto& w : works) {
    w->getFuture()->addCallback([countdown](c10::ivalue::Future& f) {
      countdown->done(f.hasError() ? f.exception_ptr() : nullptr);
    });
  }
  return work;
}

void ProcessGroupSmddp::setTimeout(std::chrono::milliseconds timeout) {
  if (comm_) comm_->setTimeout(timeout);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::allreduce(std::vector<at::Tensor>& tensors,
                                                            const c10d::AllreduceOptions& opts) {
  TORCH_CHECK_VALUE(tensors.size() == 1, "smddp all_reduce takes exactly one tensor per call, got ",
                    tensors.size(), " (use all_reduce_coalesced for several)");
  checkTensor(tensors[0], "all_reduce");
  DataType dt = toDataType(tensors[0], "all_reduce");
  std::optional<double> factor;
  auto op = toReduceOpScaled(opts.reduceOp, dt, "all_reduce", &factor);
  Staging staging;
  at::Tensor t = staging.stageAllreduce(tensors[0], factor);
  smddp::CallHooks hooks{{extentOf(tensors[0])}, staging.preparer()};
  // c10d's all_reduce(async_op=False) waits on the Work at once: the call
  // may then run on this thread (CallHooks::callerWaits). Not inside a
  // coalescing block, whose calls complete together.
  hooks.callerWaits = !opts.asyncOp && !coalescingNow();
  return guarded([&] {
    return launch(rank_, c10d::OpType::ALLREDUCE, "smddp:all_reduce", tensors, tensors, staging,
                  [&](smddp::Communicator::Done done) {
                    return comm_->allreduce({bufferOf(t)}, dt, op, std::move(done),
                                            std::move(hooks));
                  });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK_VALUE(!tensors.empty(), "smddp all_reduce_coalesced: no tensors given");
  DataType dt = toDataType(tensors[0], "all_reduce_coalesced");
  for (const auto& t : tensors) {
    checkTensor(t, "all_reduce_coalesced");
    TORCH_CHECK_TYPE(t.scalar_type() == tensors[0].scalar_type(),
                     "smddp all_reduce_coalesced: all tensors must have the same dtype (got ",
                     tensors[0].scalar_type(), " and ", t.scalar_type(), ")");
  }
  std::optional<double> factor;
  auto op = toReduceOpScaled(opts.reduceOp, dt, "all_reduce_coalesced", &factor);
  // One engine call per tensor, in list order: the same tensor (or two
  // views of one storage) listed twice is reduced twice, as by two
  // all_reduce calls, and the engine still fuses the calls into one batch
  // wherever they do not overlap. Each call copies its staged result back
  // when it completes, before a later call on that memory reads it.
  auto work = c10::make_intrusive<WorkSmddp>(rank_, c10d::OpType::ALLREDUCE_COALESCED,
                                             "smddp:all_reduce_coalesced", tensors, tensors);
  auto countdown = std::make_shared<Countdown>(work, static_cast<int>(tensors.size()));
  return guarded([&] {
    uint64_t seq = 0;
    for (const auto& user : tensors) {
      Staging staging;
      at::Tensor t = staging.stageAllreduce(user, factor);
      smddp::CallHooks hooks{{extentOf(user)}, staging.preparer()};
      auto keep = std::make_shared<std::vector<at::Tensor>>(staging.work);
      seq = comm_->allreduce(
          {bufferOf(t)}, dt, op,
          [countdown, keep, finish = staging.finisher()](std::exception_ptr e) {
            if (!e && finish) {
              try {
                finish();
              } catch (...) {
                e = std::current_exception();
              }
            }
            countdown->done(e);
          },
          std::move(hooks));
    }
    work->setSequence(seq);
    return c10::intrusive_ptr<c10d::Work>(work);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::broadcast(std::vector<at::Tensor>& tensors,
                                                            const c10d::BroadcastOptions& opts) {
  TORCH_CHECK_VALUE(tensors.size() == 1, "smddp broadcast takes exactly one tensor per call, got ",
                    tensors.size());
  TORCH_CHECK_VALUE(opts.rootRank >= 0 && opts.rootRank < size_, "smddp broadcast: root rank ",
                    opts.rootRank, " is outside the group of size ", size_);
  TORCH_CHECK_VALUE(opts.rootTensor == 0, "smddp broadcast: rootTensor must be 0");
  checkTensor(tensors[0], "broadcast");
  DataType dt = toDataType(tensors[0], "broadcast");
  Staging staging;
  at::Tensor t = staging.stage(tensors[0], true);
  int root = static_cast<int>(opts.rootRank);
  return guarded([&] {
    return launch(rank_, c10d::OpType::BROADCAST, "smddp:broadcast", tensors, tensors, staging,
                  [&](smddp::Communicator::Done done) {
                    return comm_->broadcast({bufferOf(t)}, dt, root, std::move(done));
                  });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  TORCH_CHECK_VALUE(inputs.size() == 1 && outputs.size() == 1,
                    "smddp all_gather takes one input tensor and one output list");
  TORCH_CHECK_VALUE(static_cast<int>(outputs[0].size()) == size_, "smddp all_gather: the output "
                    "list has length ", outputs[0].size(), " but the world size is ", size_);
  const at::Tensor& in = inputs[0];
  checkTensor(in, "all_gather");
  DataType dt = toDataType(in, "all_gather");
  Staging staging;
  at::Tensor inC = staging.stage(in, false);
  std::vector<Buffer> outs;
  for (const auto& o : outputs[0]) {
    checkTensor(o, "all_gather");
    TORCH_CHECK_TYPE(o.scalar_type() == in.scalar_type(), "smddp all_gather: output dtype ",
                     o.scalar_type(), " differs from input dtype ", in.scalar_type());
    TORCH_CHECK_VALUE(o.numel() == in.numel(), "smddp all_gather: output tensor size (", o.numel(),
                      " elements) differs from the input size (", in.numel(), " elements)");
    outs.push_back(bufferOf(staging.stage(o, true)));
  }
  return guarded([&] {
    return launch(rank_, c10d::OpType::ALLGATHER, "smddp:all_gather", outputs[0], inputs, staging,
                  [&](smddp::Communicator::Done done) {
                    return comm_->allgather(bufferOf(inC), outs, dt, std::move(done));
                  });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  checkTensor(input, "all_gather_into_tensor");
  checkTensor(output, "all_gather_into_tensor");
  DataType dt = toDataType(input, "all_gather_into_tensor");
  TORCH_CHECK_TYPE(output.scalar_type() == input.scalar_type(),
                   "smddp all_gather_into_tensor: output dtype ", output.scalar_type(),
                   " differs from input dtype ", input.scalar_type());
  TORCH_CHECK_VALUE(output.numel() == input.numel() * size_,
                    "smddp all_gather_into_tensor: output size is ", output.numel(),
                    " elements but must be world size (", size_, ") x input size (", input.numel(), ")");
  Staging staging;
  at::Tensor inC = staging.stage(input, false);
  at::Tensor outC = staging.stage(output, true);
  std::vector<Buffer> outs;
  auto* base = static_cast<uint8_t*>(outC.data_ptr());
  size_t es = outC.element_size();
  for (int r = 0; r < size_; ++r) {
    outs.push_back(Buffer{base + r * input.numel() * es, static_cast<uint64_t>(input.numel())});
  }
  std::vector<at::Tensor> outputs{output};
  std::vector<at::Tensor> inputs{input};
  return guarded([&] {
    return launch(rank_, c10d::OpType::_ALLGATHER_BASE, "smddp:all_gather_into_tensor", outputs,
                  inputs, staging, [&](smddp::Communicator::Done done) {
                    return comm_->allgather(bufferOf(inC), outs, dt, std::move(done));
                  });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::barrier(const c10d::BarrierOptions& opts) {
  Staging staging;
  return guarded([&] {
    return launch(rank_, c10d::OpType::BARRIER, "smddp:barrier", {}, {}, staging,
                  [&](smddp::Communicator::Done done) { return comm_->barrier(std::move(done)); });
  });
}

}  // namespace c10d_smddp
