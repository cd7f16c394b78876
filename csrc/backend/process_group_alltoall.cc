// All-to-all in its two c10d forms: one flat tensor each way with optional
// split sizes along dim 0 (all_to_all_single), and lists of world-size
// tensors (all_to_all). Arguments are checked before anything is queued.
#include "backend/engine_call.h"

namespace c10d_smddp {

namespace {

// Elements per rank of `t` under `splits` (rows of dim 0; empty means equal
// parts), with messages that name the collective and the side.
std::vector<uint64_t> splitCounts(const at::Tensor& t, const std::vector<int64_t>& splits,
                                  int world, const char* op, const char* which) {
  const int64_t rowElems = t.dim() == 0 ? 1 : (t.size(0) ? t.numel() / t.size(0) : 0);
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  std::vector<uint64_t> c(world);
  if (splits.empty()) {
    TORCH_CHECK_VALUE(rows % world == 0, "smddp ", op, ": ", which, " dim 0 (", rows,
                      ") is not divisible by the world size (", world, ")");
    for (auto& x : c) x = static_cast<uint64_t>(rows / world * rowElems);
    return c;
  }
  TORCH_CHECK_VALUE(static_cast<int>(splits.size()) == world, "smddp ", op, ": ", which,
                    " split sizes have length ", splits.size(), " but the world size is ", world);
  int64_t total = 0;
  for (int r = 0; r < world; ++r) {
    TORCH_CHECK_VALUE(splits[r] >= 0, "smddp ", op, ": negative split size");
    total += splits[r];
    c[r] = static_cast<uint64_t>(splits[r] * rowElems);
  }
  TORCH_CHECK_VALUE(total == rows, "smddp ", op, ": ", which, " split sizes sum to ", total,
                    " but dim 0 is ", rows);
  return c;
}

// Consecutive views of a contiguous tensor, counts[r] elements for rank r.
std::vector<Buffer> splitViews(const at::Tensor& t, const std::vector<uint64_t>& counts) {
  std::vector<Buffer> out;
  auto* base = static_cast<uint8_t*>(t.data_ptr());
  const size_t es = t.element_size();
  uint64_t off = 0;
  for (uint64_t n : counts) {
    out.push_back(Buffer{base + off * es, n});
    off += n;
  }
  return out;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputSplits,
    std::vector<int64_t>& inputSplits, const c10d::AllToAllOptions& opts) {
  if (auto* dev = deviceFor("all_to_all_single", output, input)) {
    return viaDevice(dev, c10d::OpType::ALLTOALL_BASE, "all_to_all_single", {output}, output, input,
                     [outputSplits, inputSplits, opts](ProcessGroupSmddp& pg, auto& out, auto& in) mutable {
                       return pg.alltoall_base(out, in, outputSplits, inputSplits, opts);
                     });
  }
  const char* name = "all_to_all_single";
  checkTensor(output, name);
  DataType dt = checkedMovedDataType(input, name);
  TORCH_CHECK_TYPE(output.scalar_type() == input.scalar_type(), "smddp ", name, ": output dtype ",
                   output.scalar_type(), " differs from input dtype ", input.scalar_type());
  auto inCounts = splitCounts(input, inputSplits, size_, name, "input");
  auto outCounts = splitCounts(output, outputSplits, size_, name, "output");
  EngineCall call(opts);
  std::vector<Buffer> ins = splitViews(call.staging.stage(input, Use::kIn), inCounts);
  std::vector<Buffer> outs = splitViews(call.staging.stage(output, Use::kOut), outCounts);
  call.parts.push_back([&](smddp::Communicator::Done done, smddp::CallHooks hooks) {
    return smddp::alltoall(*comm_, ins, outs, dt, std::move(done), std::move(hooks));
  });
  return submit(c10d::OpType::ALLTOALL_BASE, "smddp:all_to_all_single", {output}, {input}, call);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::alltoall(std::vector<at::Tensor>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::AllToAllOptions& opts) {
  if (auto* dev = deviceFor("all_to_all", outputs, inputs)) {
    return viaDevice(dev, c10d::OpType::ALLTOALL, "all_to_all", outputs, outputs, inputs,
                     [opts](ProcessGroupSmddp& pg, auto& out, auto& in) {
                       return pg.alltoall(out, in, opts);
                     });
  }
  const char* name = "all_to_all";
  TORCH_CHECK_VALUE(static_cast<int>(inputs.size()) == size_ &&
                        static_cast<int>(outputs.size()) == size_,
                    "smddp ", name, ": input and output lists must have length world size (",
                    size_, "), got ", inputs.size(), " and ", outputs.size());
  DataType dt = toMovedDataType(inputs[0], name);
  EngineCall call(opts);
  std::vector<Buffer> ins, outs;
  for (int r = 0; r < size_; ++r) {
    checkTensor(inputs[r], name);
    checkTensor(outputs[r], name);
    TORCH_CHECK_TYPE(inputs[r].scalar_type() == inputs[0].scalar_type() &&
                         outputs[r].scalar_type() == inputs[0].scalar_type(),
                     "smddp ", name, ": all tensors must have the same dtype");
    ins.push_back(bufferOf(call.staging.stage(inputs[r], Use::kIn)));
    outs.push_back(bufferOf(call.staging.stage(outputs[r], Use::kOut)));
  }
  call.parts.push_back([&](smddp::Communicator::Done done, smddp::CallHooks hooks) {
    return smddp::alltoall(*comm_, ins, outs, dt, std::move(done), std::move(hooks));
  });
  return submit(c10d::OpType::ALLTOALL, "smddp:all_to_all", outputs, inputs, call);
}

}  // namespace c10d_smddp
