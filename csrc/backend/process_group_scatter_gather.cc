// The collectives beyond allreduce/broadcast/allgather: reduce-scatter,
// reduce, gather, scatter, all-to-all and the coalesced allgather and
// reduce-scatter variants. Validation happens here, before anything is
// queued; the algorithms live in engine/rooted.cc.
#include "backend/call_support.h"
#include "backend/process_group.h"

namespace c10d_smddp {

namespace {

// Byte-offset views of one contiguous tensor, `count` elements each.
std::vector<Buffer> slices(const at::Tensor& t, int parts, uint64_t count) {
  std::vector<Buffer> out;
  auto* base = static_cast<uint8_t*>(t.data_ptr());
  for (int r = 0; r < parts; ++r) out.push_back(Buffer{base + r * count * t.element_size(), count});
  return out;
}

void checkSame(const at::Tensor& a, const at::Tensor& ref, const char* op, const char* what) {
  checkTensor(a, op);
  TORCH_CHECK_TYPE(a.scalar_type() == ref.scalar_type(), "smddp ", op, ": ", what, " dtype ",
                   a.scalar_type(), " differs from ", ref.scalar_type());
  TORCH_CHECK_VALUE(a.numel() == ref.numel(), "smddp ", op, ": ", what, " size (", a.numel(),
                    " elements) differs from the expected size (", ref.numel(), " elements)");
}

}  // namespace

void ProcessGroupSmddp::checkRoot(int64_t root, const char* op) const {
  TORCH_CHECK_VALUE(root >= 0 && root < size_, "smddp ", op, ": root rank ", root,
                    " is outside the group of size ", size_);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == 1 && inputs.size() == 1,
                    "smddp reduce_scatter takes one output tensor and one input list");
  TORCH_CHECK_VALUE(static_cast<int>(inputs[0].size()) == size_, "smddp reduce_scatter: the "
                    "input list has length ", inputs[0].size(), " but the world size is ", size_);
  const at::Tensor& out = outputs[0];
  checkTensor(out, "reduce_scatter");
  DataType dt = toDataType(out, "reduce_scatter");
  std::optional<double> factor;
  auto op = toReduceOpScaled(opts.reduceOp, dt, "reduce_scatter", &factor);
  Staging staging;
  std::vector<Buffer> ins;
  for (const auto& t : inputs[0]) {
    checkSame(t, out, "reduce_scatter", "input");
    ins.push_back(bufferOf(staging.stageInput(t, factor)));
  }
  Buffer o = bufferOf(staging.stage(out, true));
  return guarded([&] {
    return launch(rank_, c10d::OpType::REDUCE_SCATTER, "smddp:reduce_scatter", outputs,
                  inputs[0], staging, [&](smddp::Communicator::Done done) {
                    return comm_->reduceScatter(ins, o, dt, op, std::move(done));
                  });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  std::vector<at::Tensor> outs{output}, ins{input};
  return reduce_scatter_tensor_coalesced(outs, ins, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const char* name = "reduce_scatter_tensor";
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "smddp ", name, ": ", outputs.size(),
                    " outputs but ", inputs.size(), " inputs");
  Staging staging;
  std::vector<std::vector<Buffer>> ins;
  std::vector<Buffer> outs;
  std::vector<DataType> dts;
  std::vector<smddp::ReduceOp> ops;
  for (size_t i = 0; i < outputs.size(); ++i) {
    checkTensor(outputs[i], name);
    checkTensor(inputs[i], name);
    DataType dt = toDataType(inputs[i], name);
    TORCH_CHECK_TYPE(outputs[i].scalar_type() == inputs[i].scalar_type(), "smddp ", name,
                     ": output dtype ", outputs[i].scalar_type(), " differs from input dtype ",
                     inputs[i].scalar_type());
    TORCH_CHECK_VALUE(inputs[i].numel() == outputs[i].numel() * size_, "smddp ", name,
                      ": input size is ", inputs[i].numel(), " elements but must be world size (",
                      size_, ") x output size (", outputs[i].numel(), ")");
    std::optional<double> factor;
    ops.push_back(toReduceOpScaled(opts.reduceOp, dt, name, &factor));
    dts.push_back(dt);
    at::Tensor in = staging.stageInput(inputs[i], factor);
    ins.push_back(slices(in, size_, outputs[i].numel()));
    outs.push_back(bufferOf(staging.stage(outputs[i], true)));
  }
  return guarded([&] {
    return launchMany(rank_, c10d::OpType::_REDUCE_SCATTER_BASE, "smddp:reduce_scatter_tensor",
                      outputs, inputs, staging, static_cast<int>(outputs.size()),
                      [&](int i, smddp::Communicator::Done done) {
                        return comm_->reduceScatter(ins[i], outs[i], dts[i], ops[i],
                                                    std::move(done));
                      });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const char* name = "all_gather_into_tensor";
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "smddp ", name, ": ", outputs.size(),
                    " outputs but ", inputs.size(), " inputs");
  Staging staging;
  std::vector<Buffer> ins;
  std::vector<std::vector<Buffer>> outs;
  std::vector<DataType> dts;
  for (size_t i = 0; i < outputs.size(); ++i) {
    checkTensor(outputs[i], name);
    checkTensor(inputs[i], name);
    dts.push_back(toDataType(inputs[i], name));
    TORCH_CHECK_TYPE(outputs[i].scalar_type() == inputs[i].scalar_type(), "smddp ", name,
                     ": output dtype ", outputs[i].scalar_type(), " differs from input dtype ",
                     inputs[i].scalar_type());
    TORCH_CHECK_VALUE(outputs[i].numel() == inputs[i].numel() * size_, "smddp ", name,
                      ": output size is ", outputs[i].numel(), " elements but must be world size (",
                      size_, ") x input size (", inputs[i].numel(), ")");
    ins.push_back(bufferOf(staging.stage(inputs[i], false)));
    outs.push_back(slices(staging.stage(outputs[i], true), size_, inputs[i].numel()));
  }
  return guarded([&] {
    return launchMany(rank_, c10d::OpType::COALESCED, "smddp:all_gather_into_tensor_coalesced",
                      outputs, inputs, staging, static_cast<int>(outputs.size()),
                      [&](int i, smddp::Communicator::Done done) {
                        return comm_->allgather(ins[i], outs[i], dts[i], std::move(done));
                      });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const char* name = "all_gather_coalesced";
  TORCH_CHECK_VALUE(outputLists.size() == static_cast<size_t>(size_), "smddp ", name,
                    ": expected one output list per rank (", size_, "), got ", outputLists.size());
  Staging staging;
  std::vector<Buffer> ins;
  std::vector<std::vector<Buffer>> outs(inputs.size());
  std::vector<DataType> dts;
  std::vector<at::Tensor> flatOutputs;
  for (const auto& in : inputs) {
    checkTensor(in, name);
    dts.push_back(toDataType(in, name));
    ins.push_back(bufferOf(staging.stage(in, false)));
  }
  for (int r = 0; r < size_; ++r) {
    TORCH_CHECK_VALUE(outputLists[r].size() == inputs.size(), "smddp ", name, ": output list ",
                      r, " has length ", outputLists[r].size(), " but there are ", inputs.size(),
                      " inputs");
    for (size_t i = 0; i < inputs.size(); ++i) {
      checkSame(outputLists[r][i], inputs[i], name, "output");
      outs[i].push_back(bufferOf(staging.stage(outputLists[r][i], true)));
      flatOutputs.push_back(outputLists[r][i]);
    }
  }
  return guarded([&] {
    return launchMany(rank_, c10d::OpType::ALLGATHER_COALESCED, "smddp:all_gather_coalesced",
                      flatOutputs, inputs, staging, static_cast<int>(inputs.size()),
                      [&](int i, smddp::Communicator::Done done) {
                        return comm_->allgather(ins[i], outs[i], dts[i], std::move(done));
                      });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::reduce(std::vector<at::Tensor>& tensors,
                                                         const c10d::ReduceOptions& opts) {
  TORCH_CHECK_VALUE(tensors.size() == 1, "smddp reduce takes exactly one tensor per call, got ",
                    tensors.size());
  checkRoot(opts.rootRank, "reduce");
  checkTensor(tensors[0], "reduce");
  DataType dt = toDataType(tensors[0], "reduce");
  std::optional<double> factor;
  auto op = toReduceOpScaled(opts.reduceOp, dt, "reduce", &factor);
  Staging staging;
  int root = static_cast<int>(opts.rootRank);
  // With PREMUL_SUM only the root gets the result back; other ranks' tensors
  // stay as they were (the scaled copy is private).
  Buffer b = bufferOf(factor ? staging.stageScaled(tensors[0], *factor, rank_ == root)
                             : staging.stage(tensors[0], true));
  return guarded([&] {
    return launch(rank_, c10d::OpType::REDUCE, "smddp:reduce", tensors, tensors, staging,
                  [&](smddp::Communicator::Done done) {
                    return comm_->reduce(b, dt, op, root, std::move(done));
                  });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  TORCH_CHECK_VALUE(inputs.size() == 1, "smddp gather takes one input tensor");
  checkRoot(opts.rootRank, "gather");
  const at::Tensor& in = inputs[0];
  checkTensor(in, "gather");
  DataType dt = toDataType(in, "gather");
  int root = static_cast<int>(opts.rootRank);
  Staging staging;
  Buffer inB = bufferOf(staging.stage(in, false));
  std::vector<Buffer> outs;
  std::vector<at::Tensor> outTensors;
  if (rank_ == root) {
    TORCH_CHECK_VALUE(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
                      "smddp gather: the root needs an output list of length world size (", size_,
                      ")");
    for (const auto& o : outputs[0]) {
      checkSame(o, in, "gather", "output");
      outs.push_back(bufferOf(staging.stage(o, true)));
      outTensors.push_back(o);
    }
  } else {
    TORCH_CHECK_VALUE(outputs.empty() || outputs[0].empty(),
                      "smddp gather: only the root may pass output tensors");
  }
  return guarded([&] {
    return launch(rank_, c10d::OpType::GATHER, "smddp:gather", outTensors, inputs, staging,
                  [&](smddp::Communicator::Done done) {
                    return comm_->gather(inB, outs, dt, root, std::move(done));
                  });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == 1, "smddp scatter takes one output tensor");
  checkRoot(opts.rootRank, "scatter");
  const at::Tensor& out = outputs[0];
  checkTensor(out, "scatter");
  DataType dt = toDataType(out, "scatter");
  int root = static_cast<int>(opts.rootRank);
  Staging staging;
  std::vector<Buffer> ins;
  std::vector<at::Tensor> inTensors;
  if (rank_ == root) {
    TORCH_CHECK_VALUE(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
                      "smddp scatter: the root needs an input list of length world size (", size_,
                      ")");
    for (const auto& t : inputs[0]) {
      checkSame(t, out, "scatter", "input");
      ins.push_back(bufferOf(staging.stage(t, false)));
      inTensors.push_back(t);
    }
  } else {
    TORCH_CHECK_VALUE(inputs.empty() || inputs[0].empty(),
                      "smddp scatter: only the root may pass input tensors");
  }
  Buffer o = bufferOf(staging.stage(out, true));
  return guarded([&] {
    return launch(rank_, c10d::OpType::SCATTER, "smddp:scatter", outputs, inTensors, staging,
                  [&](smddp::Communicator::Done done) {
                    return comm_->scatter(ins, o, dt, root, std::move(done));
                  });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputSplits,
    std::vector<int64_t>& inputSplits, const c10d::AllToAllOptions& opts) {
  const char* name = "all_to_all_single";
  checkTensor(output, name);
  checkTensor(input, name);
  DataType dt = toDataType(input, name);
  TORCH_CHECK_TYPE(output.scalar_type() == input.scalar_type(), "smddp ", name, ": output dtype ",
                   output.scalar_type(), " differs from input dtype ", input.scalar_type());
  // Splits count rows of dim 0; empty splits mean equal parts.
  auto rowElems = [](const at::Tensor& t) -> int64_t {
    return t.dim() == 0 ? 1 : (t.size(0) ? t.numel() / t.size(0) : 0);
  };
  auto counts = [&](const at::Tensor& t, const std::vector<int64_t>& splits, const char* which) {
    std::vector<uint64_t> c(size_);
    int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    if (splits.empty()) {
      TORCH_CHECK_VALUE(rows % size_ == 0, "smddp ", name, ": ", which, " dim 0 (", rows,
                        ") is not divisible by the world size (", size_, ")");
      for (auto& x : c) x = static_cast<uint64_t>(rows / size_ * rowElems(t));
    } else {
      TORCH_CHECK_VALUE(static_cast<int>(splits.size()) == size_, "smddp ", name, ": ", which,
                        " split sizes have length ", splits.size(), " but the world size is ",
                        size_);
      int64_t total = 0;
      for (int r = 0; r < size_; ++r) {
        TORCH_CHECK_VALUE(splits[r] >= 0, "smddp ", name, ": negative split size");
        total += splits[r];
        c[r] = static_cast<uint64_t>(splits[r] * rowElems(t));
      }
      TORCH_CHECK_VALUE(total == rows, "smddp ", name, ": ", which, " split sizes sum to ", total,
                        " but dim 0 is ", rows);
    }
    return c;
  };
  auto inCounts = counts(input, inputSplits, "input");
  auto outCounts = counts(output, outputSplits, "output");
  Staging staging;
  at::Tensor inC = staging.stage(input, false);
  at::Tensor outC = staging.stage(output, true);
  std::vector<Buffer> ins, outs;
  size_t es = input.element_size();
  uint64_t inOff = 0, outOff = 0;
  for (int r = 0; r < size_; ++r) {
    ins.push_back(Buffer{static_cast<uint8_t*>(inC.data_ptr()) + inOff * es, inCounts[r]});
    outs.push_back(Buffer{static_cast<uint8_t*>(outC.data_ptr()) + outOff * es, outCounts[r]});
    inOff += inCounts[r];
    outOff += outCounts[r];
  }
  std::vector<at::Tensor> outT{output}, inT{input};
  return guarded([&] {
    return launch(rank_, c10d::OpType::ALLTOALL_BASE, "smddp:all_to_all_single", outT, inT,
                  staging, [&](smddp::Communicator::Done done) {
                    return comm_->alltoall(ins, outs, dt, std::move(done));
                  });
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::alltoall(std::vector<at::Tensor>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::AllToAllOptions& opts) {
  const char* name = "all_to_all";
  TORCH_CHECK_VALUE(static_cast<int>(inputs.size()) == size_ &&
                        static_cast<int>(outputs.size()) == size_,
                    "smddp ", name, ": input and output lists must have length world size (",
                    size_, "), got ", inputs.size(), " and ", outputs.size());
  Staging staging;
  std::vector<Buffer> ins, outs;
  DataType dt = toDataType(inputs[0], name);
  for (int r = 0; r < size_; ++r) {
    checkTensor(inputs[r], name);
    checkTensor(outputs[r], name);
    TORCH_CHECK_TYPE(inputs[r].scalar_type() == inputs[0].scalar_type() &&
                         outputs[r].scalar_type() == inputs[0].scalar_type(),
                     "smddp ", name, ": all tensors must have the same dtype");
    ins.push_back(bufferOf(staging.stage(inputs[r], false)));
    outs.push_back(bufferOf(staging.stage(outputs[r], true)));
  }
  return guarded([&] {
    return launch(rank_, c10d::OpType::ALLTOALL, "smddp:all_to_all", outputs, inputs, staging,
                  [&](smddp::Communicator::Done done) {
                    return comm_->alltoall(ins, outs, dt, std::move(done));
                  });
  });
}

}  // namespace c10d_smddp
