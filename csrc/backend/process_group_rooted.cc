// The rooted collectives: reduce, gather and scatter. Each checks its
// arguments (the root's tensor list included) before anything is queued;
// the algorithms live in algorithms/rooted.cc.
#include "backend/engine_call.h"

namespace c10d_smddp {

namespace {

// Gather's outputs or scatter's inputs: the root passes one list of
// world-size tensors, every other rank passes none.
std::vector<at::Tensor> rootList(const std::vector<std::vector<at::Tensor>>& lists, bool isRoot,
                                 int world, const char* op, const char* what) {
  if (!isRoot) {
    TORCH_CHECK_VALUE(lists.empty() || lists[0].empty(), "smddp ", op, ": only the root may pass ",
                      what, " tensors");
    return {};
  }
  TORCH_CHECK_VALUE(lists.size() == 1 && static_cast<int>(lists[0].size()) == world, "smddp ",
                    op, ": the root needs an ", what, " list of length world size (", world, ")");
  return lists[0];
}

}  // namespace

void ProcessGroupSmddp::checkRoot(int64_t root, const char* op) const {
  TORCH_CHECK_VALUE(root >= 0 && root < size_, "smddp ", op, ": root rank ", root,
                    " is outside the group of size ", size_);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::reduce(std::vector<at::Tensor>& tensors,
                                                         const c10d::ReduceOptions& opts) {
  if (auto* dev = deviceFor("reduce", tensors)) {
    return viaDeviceInPlace(
        dev, c10d::OpType::REDUCE, "reduce", tensors,
        [opts](ProcessGroupSmddp& pg, auto& h, const c10d::ReduceOp& op) {
          auto o = opts;
          o.reduceOp = op;
          return pg.reduce(h, o);
        },
        &opts.reduceOp);
  }
  TORCH_CHECK_VALUE(tensors.size() == 1, "smddp reduce takes exactly one tensor per call, got ",
                    tensors.size());
  checkRoot(opts.rootRank, "reduce");
  DataType dt = checkedDataType(tensors[0], "reduce");
  std::optional<double> factor;
  auto op = toReduceOpScaled(opts.reduceOp, dt, "reduce", &factor);
  const int root = static_cast<int>(opts.rootRank);
  EngineCall call(opts);
  // With PREMUL_SUM only the root gets the result back; other ranks' tensors
  // stay as they were (the scaled copy is private).
  Buffer b = bufferOf(factor ? call.staging.stageScaled(tensors[0], *factor, rank_ == root)
                             : call.staging.stage(tensors[0], Use::kInOut));
  call.parts.push_back([&](smddp::Communicator::Done done, smddp::CallHooks hooks) {
    return smddp::reduce(*comm_, b, dt, op, root, std::move(done), std::move(hooks));
  });
  return submit(c10d::OpType::REDUCE, "smddp:reduce", tensors, tensors, call);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  if (auto* dev = deviceFor("gather", outputs, inputs)) {
    return viaDevice(dev, c10d::OpType::GATHER, "gather", outputs.empty() ? std::vector<at::Tensor>{} : outputs[0], outputs, inputs,
                     [opts](ProcessGroupSmddp& pg, auto& out, auto& in) {
                       return pg.gather(out, in, opts);
                     });
  }
  TORCH_CHECK_VALUE(inputs.size() == 1, "smddp gather takes one input tensor");
  checkRoot(opts.rootRank, "gather");
  const at::Tensor& in = inputs[0];
  DataType dt = checkedMovedDataType(in, "gather");
  const int root = static_cast<int>(opts.rootRank);
  EngineCall call(opts);
  Buffer inB = bufferOf(call.staging.stage(in, Use::kIn));
  std::vector<at::Tensor> outTensors = rootList(outputs, rank_ == root, size_, "gather", "output");
  std::vector<Buffer> outs;
  for (const auto& o : outTensors) {
    checkSame(o, in, "gather", "output");
    outs.push_back(bufferOf(call.staging.stage(o, Use::kOut)));
  }
  call.parts.push_back([&](smddp::Communicator::Done done, smddp::CallHooks hooks) {
    return smddp::gather(*comm_, inB, outs, dt, root, std::move(done), std::move(hooks));
  });
  return submit(c10d::OpType::GATHER, "smddp:gather", outTensors, inputs, call);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  if (auto* dev = deviceFor("scatter", outputs, inputs)) {
    return viaDevice(dev, c10d::OpType::SCATTER, "scatter", outputs, outputs, inputs,
                     [opts](ProcessGroupSmddp& pg, auto& out, auto& in) {
                       return pg.scatter(out, in, opts);
                     });
  }
  TORCH_CHECK_VALUE(outputs.size() == 1, "smddp scatter takes one output tensor");
  checkRoot(opts.rootRank, "scatter");
  const at::Tensor& out = outputs[0];
  DataType dt = checkedMovedDataType(out, "scatter");
  const int root = static_cast<int>(opts.rootRank);
  EngineCall call(opts);
  std::vector<at::Tensor> inTensors = rootList(inputs, rank_ == root, size_, "scatter", "input");
  std::vector<Buffer> ins;
  for (const auto& t : inTensors) {
    checkSame(t, out, "scatter", "input");
    ins.push_back(bufferOf(call.staging.stage(t, Use::kIn)));
  }
  Buffer o = bufferOf(call.staging.stage(out, Use::kOut));
  call.parts.push_back([&](smddp::Communicator::Done done, smddp::CallHooks hooks) {
    return smddp::scatter(*comm_, ins, o, dt, root, std::move(done), std::move(hooks));
  });
  return submit(c10d::OpType::SCATTER, "smddp:scatter", outputs, inTensors, call);
}

}  // namespace c10d_smddp
