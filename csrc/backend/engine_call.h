// The one path the collectives outside process_group.cc take from checked
// arguments to a Work: each fills an EngineCall (its staged tensors and one
// engine start per part) and hands it to ProcessGroupSmddp::submit(). Also
// the argument checks those collectives share, so each message is written
// once and names the collective.
#pragma once

#include <ATen/record_function.h>
#include <torch/csrc/distributed/c10d/ParamCommsUtils.hpp>

#include <functional>
#include <tuple>
#include <type_traits>
#include <vector>

#include "backend/call_support.h"
#include "backend/device_collectives.h"
#include "backend/process_group.h"
#include "algorithms/collective_calls.h"

namespace c10d_smddp {

// One call as the engine will see it. A plain collective has one part; a
// coalesced variant has one per tensor, all behind one Work. Part i is
// given its completion and its hooks (hooks.prepare fills the copies staged
// for part i; see Staging) and returns its sequence number.
struct EngineCall {
  // Made from the collective's c10d options, whose asyncOp every call
  // reads here. torch leaves BarrierOptions::asyncOp at its default (true)
  // even for a synchronous dist.barrier, so a barrier always queues.
  template <typename Options>
  explicit EngineCall(const Options& opts) : callerWaits(!opts.asyncOp) {}

  Staging staging;
  std::vector<std::function<uint64_t(smddp::Communicator::Done, smddp::CallHooks)>> parts;
  // The caller waits on the Work at once (c10d's async_op=False): a call of
  // one part may then run on the caller's thread (CallHooks::callerWaits).
  bool callerWaits;
};

// The collective's name in torch.profiler's record_param_comms events, as
// ProcessGroupNCCL names its own.
inline const char* paramCommsName(c10d::OpType type) {
  switch (type) {
    case c10d::OpType::ALLREDUCE: return "allreduce";
    case c10d::OpType::ALLREDUCE_COALESCED: return "allreduce_coalesced";
    case c10d::OpType::BROADCAST: return "broadcast";
    case c10d::OpType::ALLGATHER: return "all_gather";
    case c10d::OpType::_ALLGATHER_BASE: return "_allgather_base";
    case c10d::OpType::ALLGATHER_COALESCED: return "all_gather_coalesced";
    case c10d::OpType::COALESCED: return "allgather_into_tensor_coalesced";
    case c10d::OpType::REDUCE_SCATTER: return "reduce_scatter";
    case c10d::OpType::_REDUCE_SCATTER_BASE: return "_reduce_scatter_base";
    case c10d::OpType::ALLTOALL: return "all_to_all";
    case c10d::OpType::ALLTOALL_BASE: return "all_to_allv";
    case c10d::OpType::REDUCE: return "reduce";
    case c10d::OpType::GATHER: return "gather";
    case c10d::OpType::SCATTER: return "scatter";
    case c10d::OpType::BARRIER: return "barrier";
    default: return "unknown";
  }
}

inline int64_t totalNumel(const std::vector<at::Tensor>& ts) {
  int64_t n = 0;
  for (const auto& t : ts) n += t.numel();
  return n;
}

// The parts run here, before submit() returns, so they may capture the
// caller's locals by reference.
inline c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::submit(
    c10d::OpType type, const char* title, std::vector<at::Tensor> outputs,
    const std::vector<at::Tensor>& inputs, EngineCall& call) {
  if (checkingOnly()) return {};
  if (C10_UNLIKELY(at::hasCallbacks())) {
    // Under torch.profiler (or any RecordFunction observer): a
    // record_param_comms range over the enqueue, with the collective's
    // name, sizes and dtype, as ProcessGroupNCCL records. Without an
    // observer this costs one branch.
    const at::Tensor* first = !inputs.empty() ? &inputs[0] : !outputs.empty() ? &outputs[0] : nullptr;
    const auto dtype = first ? first->scalar_type() : at::kByte;
    RECORD_PARAM_COMMS_DATA(std::make_tuple(static_cast<int64_t>(comm_->nextSequence()), false),
                            std::make_tuple(groupName_, std::string("smddp")), inputs, outputs,
                            rank_, paramCommsName(type), totalNumel(inputs), totalNumel(outputs),
                            dtype, std::vector<int64_t>(), std::vector<int64_t>(), -1, -1, size_);
    return submitParts(type, title, std::move(outputs), inputs, call);
  }
  return submitParts(type, title, std::move(outputs), inputs, call);
}

inline c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::submitParts(
    c10d::OpType type, const char* title, std::vector<at::Tensor> outputs,
    const std::vector<at::Tensor>& inputs, EngineCall& call) {
  return guarded([&] {
    // Not inside a coalescing block, whose calls complete together.
    const bool callerWaits = call.callerWaits && call.parts.size() == 1 && !coalescingNow();
    return launchParts(rank_, type, title, std::move(outputs), inputs, call.staging,
                       static_cast<int>(call.parts.size()), callerWaits,
                       [&](int i, smddp::Communicator::Done done, smddp::CallHooks hooks) {
                         // The group's asynchronous error sees every failure.
                         auto noted = [errors = asyncError_, done = std::move(done)](
                                          std::exception_ptr e) {
                           if (e) errors->note(e);
                           done(e);
                         };
                         return call.parts[i](std::move(noted), std::move(hooks));
                       });
  });
}

template <typename Out, typename In, typename Call>
c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::viaDevice(DeviceCollectives* dev,
                                                            c10d::OpType type, const char* coll,
                                                            std::vector<at::Tensor> result,
                                                            const Out& outputs, const In& inputs,
                                                            Call call, const c10d::ReduceOp* op) {
  return track(dev->staged(type, coll, std::move(result),
                           [&](DeviceStage& s) -> DeviceCollectives::HostCall {
                             auto out = s.map(outputs, /*read=*/false, /*write=*/true);
                             auto in = s.map(inputs, /*read=*/true, /*write=*/false);
                             if constexpr (std::is_invocable_v<Call&, ProcessGroupSmddp&,
                                                               decltype(out)&, decltype(in)&,
                                                               const c10d::ReduceOp&>) {
                               return [out, in, call, hostOp = s.mapOp(*op)](
                                          ProcessGroupSmddp& pg) mutable {
                                 return call(pg, out, in, hostOp);
                               };
                             } else {
                               return [out, in, call](ProcessGroupSmddp& pg) mutable {
                                 return call(pg, out, in);
                               };
                             }
                           }));
}

template <typename Call>
c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::viaDeviceInPlace(DeviceCollectives* dev,
                                                                   c10d::OpType type,
                                                                   const char* coll,
                                                                   std::vector<at::Tensor>& tensors,
                                                                   Call call,
                                                                   const c10d::ReduceOp* op) {
  return track(dev->staged(type, coll, tensors,
                           [&](DeviceStage& s) -> DeviceCollectives::HostCall {
                             auto both = s.map(tensors, /*read=*/true, /*write=*/true);
                             if constexpr (std::is_invocable_v<Call&, ProcessGroupSmddp&,
                                                               decltype(both)&,
                                                               const c10d::ReduceOp&>) {
                               return [both, call, hostOp = s.mapOp(*op)](
                                          ProcessGroupSmddp& pg) mutable {
                                 return call(pg, both, hostOp);
                               };
                             } else {
                               return [both, call](ProcessGroupSmddp& pg) mutable {
                                 return call(pg, both);
                               };
                             }
                           }));
}

// A tensor the engine can take (defined, CPU, dense) and its engine dtype.
inline DataType checkedDataType(const at::Tensor& t, const char* op) {
  checkTensor(t, op);
  return toDataType(t, op);
}

// The same for a call that only moves data (toMovedDataType).
inline DataType checkedMovedDataType(const at::Tensor& t, const char* op) {
  checkTensor(t, op);
  return toMovedDataType(t, op);
}

// `a` must be usable and match `ref` in dtype and element count.
inline void checkSame(const at::Tensor& a, const at::Tensor& ref, const char* op,
                      const char* what) {
  checkTensor(a, op);
  TORCH_CHECK_TYPE(a.scalar_type() == ref.scalar_type(), "smddp ", op, ": ", what, " dtype ",
                   a.scalar_type(), " differs from ", ref.scalar_type());
  TORCH_CHECK_VALUE(a.numel() == ref.numel(), "smddp ", op, ": ", what, " size (", a.numel(),
                    " elements) differs from the expected size (", ref.numel(), " elements)");
}

// One (output, input) pair of a *_tensor collective: both usable, one dtype,
// and the side that holds every rank's part (the output of an all-gather,
// the input of a reduce-scatter) is world x the other. Returns the dtype.
inline DataType checkWholeAndPart(const at::Tensor& output, const at::Tensor& input,
                                  bool outputIsWhole, int world, const char* op) {
  checkTensor(output, op);
  checkTensor(input, op);
  // An all-gather only moves data; a reduce-scatter reduces.
  DataType dt = outputIsWhole ? toMovedDataType(input, op) : toDataType(input, op);
  TORCH_CHECK_TYPE(output.scalar_type() == input.scalar_type(), "smddp ", op, ": output dtype ",
                   output.scalar_type(), " differs from input dtype ", input.scalar_type());
  const at::Tensor& whole = outputIsWhole ? output : input;
  const at::Tensor& part = outputIsWhole ? input : output;
  TORCH_CHECK_VALUE(whole.numel() == part.numel() * world, "smddp ", op, ": ",
                    outputIsWhole ? "output" : "input", " size is ", whole.numel(),
                    " elements but must be world size (", world, ") x ",
                    outputIsWhole ? "input" : "output", " size (", part.numel(), ")");
  return dt;
}

// Byte-offset views of one contiguous tensor, `count` elements each.
inline std::vector<Buffer> slices(const at::Tensor& t, int parts, uint64_t count) {
  std::vector<Buffer> out;
  auto* base = static_cast<uint8_t*>(t.data_ptr());
  for (int r = 0; r < parts; ++r) out.push_back(Buffer{base + r * count * t.element_size(), count});
  return out;
}

}  // namespace c10d_smddp
