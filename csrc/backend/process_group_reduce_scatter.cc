// Reduce-scatter in its three c10d forms: a list of per-rank inputs, one
// flat input tensor (_reduce_scatter_base), and the coalesced flat form.
// Arguments are checked before anything is queued; PREMUL_SUM scales a
// private copy of each input (Staging::stageInput).
#include "backend/engine_call.h"

namespace c10d_smddp {

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  if (auto* dev = deviceFor("reduce_scatter", outputs, inputs)) {
    if (outputs.size() == 1 && inputs.size() == 1) {
      if (auto w = dev->reduceScatterList(outputs[0], inputs[0], opts)) return track(w);
    }
    return viaDevice(
        dev, c10d::OpType::REDUCE_SCATTER, "reduce_scatter", outputs, outputs, inputs,
        [opts](ProcessGroupSmddp& pg, auto& out, auto& in, const c10d::ReduceOp& op) {
          auto o = opts;
          o.reduceOp = op;
          return pg.reduce_scatter(out, in, o);
        },
        &opts.reduceOp);
  }
  TORCH_CHECK_VALUE(outputs.size() == 1 && inputs.size() == 1,
                    "smddp reduce_scatter takes one output tensor and one input list");
  TORCH_CHECK_VALUE(static_cast<int>(inputs[0].size()) == size_, "smddp reduce_scatter: the "
                    "input list has length ", inputs[0].size(), " but the world size is ", size_);
  const at::Tensor& out = outputs[0];
  DataType dt = checkedDataType(out, "reduce_scatter");
  std::optional<double> factor;
  auto op = toReduceOpScaled(opts.reduceOp, dt, "reduce_scatter", &factor);
  EngineCall call(opts);
  std::vector<Buffer> ins;
  for (const auto& t : inputs[0]) {
    checkSame(t, out, "reduce_scatter", "input");
    ins.push_back(bufferOf(call.staging.stageInput(t, factor)));
  }
  Buffer o = bufferOf(call.staging.stage(out, Use::kOut));
  call.parts.push_back([&](smddp::Communicator::Done done, smddp::CallHooks hooks) {
    return smddp::reduceScatter(*comm_, ins, o, dt, op, std::move(done), std::move(hooks));
  });
  return submit(c10d::OpType::REDUCE_SCATTER, "smddp:reduce_scatter", outputs, inputs[0], call);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  std::vector<at::Tensor> outs{output}, ins{input};
  return reduce_scatter_tensor_coalesced(outs, ins, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  if (auto* dev = deviceFor("reduce_scatter_tensor", outputs, inputs)) {
    if (outputs.size() == 1 && inputs.size() == 1) {
      if (auto w = dev->reduceScatterBase(outputs[0], inputs[0], opts)) return track(w);
    }
    return viaDevice(
        dev, c10d::OpType::COALESCED, "reduce_scatter_tensor", outputs, outputs, inputs,
        [opts](ProcessGroupSmddp& pg, auto& out, auto& in, const c10d::ReduceOp& op) {
          auto o = opts;
          o.reduceOp = op;
          return pg.reduce_scatter_tensor_coalesced(out, in, o);
        },
        &opts.reduceOp);
  }
  const char* name = "reduce_scatter_tensor";
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "smddp ", name, ": ", outputs.size(),
                    " outputs but ", inputs.size(), " inputs");
  EngineCall call(opts);
  for (size_t i = 0; i < outputs.size(); ++i) {
    DataType dt = checkWholeAndPart(outputs[i], inputs[i], /*outputIsWhole=*/false, size_, name);
    std::optional<double> factor;
    auto op = toReduceOpScaled(opts.reduceOp, dt, name, &factor);
    at::Tensor in = call.staging.stageInput(inputs[i], factor, i);
    std::vector<Buffer> ins = slices(in, size_, outputs[i].numel());
    Buffer o = bufferOf(call.staging.stage(outputs[i], Use::kOut, i));
    call.parts.push_back([this, ins, o, dt, op](smddp::Communicator::Done done,
                                                smddp::CallHooks hooks) {
      return smddp::reduceScatter(*comm_, ins, o, dt, op, std::move(done), std::move(hooks));
    });
  }
  return submit(c10d::OpType::_REDUCE_SCATTER_BASE, "smddp:reduce_scatter_tensor", outputs,
                inputs, call);
}

}  // namespace c10d_smddp
