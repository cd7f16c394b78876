// The coalesced all-gathers: all_gather_into_tensor_coalesced (one flat
// output per input) and allgather_coalesced (one output list per rank).
// Each input is its own engine allgather, all behind one Work. The plain
// allgather forms live in process_group.cc.
#include "backend/engine_call.h"

namespace c10d_smddp {

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  if (auto* dev = deviceFor("all_gather_into_tensor", outputs, inputs)) {
    return viaDevice(dev, c10d::OpType::COALESCED, "all_gather_into_tensor", outputs, outputs, inputs,
                     [opts](ProcessGroupSmddp& pg, auto& out, auto& in) {
                       return pg.allgather_into_tensor_coalesced(out, in, opts);
                     });
  }
  const char* name = "all_gather_into_tensor";
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "smddp ", name, ": ", outputs.size(),
                    " outputs but ", inputs.size(), " inputs");
  EngineCall call(opts);
  for (size_t i = 0; i < outputs.size(); ++i) {
    DataType dt = checkWholeAndPart(outputs[i], inputs[i], /*outputIsWhole=*/true, size_, name);
    Buffer in = gatherInputOf(call.staging.stage(inputs[i], Use::kIn, i));
    std::vector<Buffer> outs =
        slices(call.staging.stage(outputs[i], Use::kOut, i), size_, inputs[i].numel());
    call.parts.push_back([this, in, outs, dt](smddp::Communicator::Done done,
                                              smddp::CallHooks hooks) {
      return smddp::allgather(*comm_, in, outs, dt, std::move(done), std::move(hooks));
    });
  }
  return submit(c10d::OpType::COALESCED, "smddp:all_gather_into_tensor_coalesced", outputs, inputs,
                call);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  if (auto* dev = deviceFor("all_gather_coalesced", outputLists, inputs)) {
    return viaDevice(dev, c10d::OpType::COALESCED, "all_gather_coalesced", flatten(outputLists), outputLists, inputs,
                     [opts](ProcessGroupSmddp& pg, auto& out, auto& in) {
                       return pg.allgather_coalesced(out, in, opts);
                     });
  }
  const char* name = "all_gather_coalesced";
  TORCH_CHECK_VALUE(outputLists.size() == static_cast<size_t>(size_), "smddp ", name,
                    ": expected one output list per rank (", size_, "), got ", outputLists.size());
  EngineCall call(opts);
  std::vector<Buffer> ins;
  std::vector<DataType> dts;
  for (size_t i = 0; i < inputs.size(); ++i) {
    dts.push_back(checkedMovedDataType(inputs[i], name));
    ins.push_back(gatherInputOf(call.staging.stage(inputs[i], Use::kIn, i)));
  }
  std::vector<std::vector<Buffer>> outs(inputs.size());
  std::vector<at::Tensor> flatOutputs;
  for (int r = 0; r < size_; ++r) {
    TORCH_CHECK_VALUE(outputLists[r].size() == inputs.size(), "smddp ", name, ": output list ",
                      r, " has length ", outputLists[r].size(), " but there are ", inputs.size(),
                      " inputs");
    for (size_t i = 0; i < inputs.size(); ++i) {
      checkSame(outputLists[r][i], inputs[i], name, "output");
      outs[i].push_back(bufferOf(call.staging.stage(outputLists[r][i], Use::kOut, i)));
      flatOutputs.push_back(outputLists[r][i]);
    }
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    call.parts.push_back([&, i](smddp::Communicator::Done done, smddp::CallHooks hooks) {
      return smddp::allgather(*comm_, ins[i], outs[i], dts[i], std::move(done), std::move(hooks));
    });
  }
  return submit(c10d::OpType::ALLGATHER_COALESCED, "smddp:all_gather_coalesced", flatOutputs,
                inputs, call);
}

}  // namespace c10d_smddp
