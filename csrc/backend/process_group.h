// The c10d::Backend registered as "smddp". It validates each call, maps
// tensors onto engine Buffers, hands the call to the Communicator (which
// returns at once) and gives back a WorkSmddp whose future completes when
// the engine is done. This is the only layer that knows about torch.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <c10/util/Exception.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <optional>
#include <vector>

#include "backend/async_error.h"
#include "backend/group_inspector.h"
#include "backend/sim_torch_device.h"
#include "common/error.h"
#include "engine/communicator.h"

namespace c10d_smddp {

struct EngineCall;
class DeviceCollectives;
class FormationCancel;
class HostGroupFormation;

// How a group forms, beyond its store, rank, size, timeout and name.
struct GroupOptions {
  // The device path's private host group: never routes to a device.
  bool hostOnly = false;
  // The standalone reduction servers torch_smddp found in a store (and the
  // key it got there), in place of SMDDP_SERVER_HOSTS.
  std::optional<smddp::RegisteredServers> servers;
  // cancel() from another thread stops the formation (store_bootstrap.h).
  std::shared_ptr<FormationCancel> cancel;
  // torch_smddp.Options' cross_host_dtype ("": SMDDP_CROSS_HOST_DTYPE).
  std::string crossHostDtype;
  // The process forms groups again and again (torchft's reconfigure): keep
  // an endpoint open and warm for the next one (spare_endpoints.h).
  bool keepSpare = false;
};

class ProcessGroupSmddp : public c10d::Backend {
 public:
  ProcessGroupSmddp(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                    std::chrono::milliseconds timeout, std::string groupName,
                    GroupOptions options = {});
  ~ProcessGroupSmddp() override;

  const std::string getBackendName() const override { return "smddp"; }
  // NCCL-style coalescing (`_coalescing_manager(device=...)`, and
  // batch_isend_irecv): calls between start and end run as issued, since
  // every Work here is already asynchronous; endCoalescing returns one Work
  // that completes when all of them have, with the first error if any.
  bool supportsCoalescing() const override { return true; }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  // process_group_allgather_coalesced.cc
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  // process_group_reduce_scatter.cc
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  // process_group_rooted.cc
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  // process_group_alltoall.cc
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplits,
                                               std::vector<int64_t>& inputSplits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  // process_group_p2p.cc
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) override;
  // process_group_alloc.cc: CPU tensors the host's ranks read without a
  // system call (FSDP2's set_allocate_memory_from_process_group_for_comm).
  bool supportsTensorAlloc(c10::DeviceIndex deviceIdx) override;
  at::Tensor allocateTensor(long size, at::TensorOptions options = {}) override;

  // torch_smddp.all_reduce_: one contiguous CPU tensor reduced in place,
  // synchronously, called straight from Python rather than through c10d's
  // dispatcher, Work and future (which cost a 4 KiB call more than the
  // whole reduction). The same engine call as all_reduce(async_op=False),
  // so it keeps the call order, fusion fences, flight recorder, timeout and
  // the "issued on every rank" rule, and it mixes freely with c10d's calls.
  // Returns false, having done nothing, for a call it leaves to
  // dist.all_reduce: a tensor that is not a dense contiguous CPU tensor of
  // an engine dtype, PREMUL_SUM, a coalescing block, a profiler observing
  // (record_param_comms), a device-simulation group.
  bool allreduceNow(at::Tensor& tensor, const c10d::ReduceOp& reduceOp);

  uint64_t getSequenceNumberForGroup() override { return comm_ ? comm_->nextSequence() : 0; }
  void setSequenceNumberForGroup() override {}
  void setTimeout(std::chrono::milliseconds timeout) override;
  // dist.shrink_group (process_group_shrink.cc): a new group of the ranks
  // not excluded, renumbered in order. SHRINK_ABORT aborts this group's
  // calls in flight first; SHRINK_DEFAULT wants it idle. shrinkTo also
  // takes torch_smddp.Options' cross_host_dtype (the binding's pg_options).
  bool supportsShrinking() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t>& ranksToExclude,
                                           int shrinkFlags,
                                           const c10::intrusive_ptr<Options>& optsOverride) override;
  c10::intrusive_ptr<ProcessGroupSmddp> shrinkTo(std::vector<int64_t> excluded, int shrinkFlags,
                                                 std::optional<std::string> crossHostDtype);
  void abort() override;
  void shutdown() override;
  // The group's asynchronous error (async_error.h): TIMEOUT or COMM_ERROR
  // once a call failed in a way that leaves the group unusable, or after
  // abort(); SUCCESS until then. inspect().errorMessage() is its text.
  c10d::ErrorType getError() override;
  // Shuts down every group of this process that is still alive (the
  // module's atexit hook: module.cc).
  static void shutdownAll();

  // smddp's own view of the group (counters, paths, lost peers, flight
  // recorder, error text): what torch_smddp and the device path read.
  const GroupInspector& inspect() const { return inspector_; }

  // While one is alive on a thread, calls made on that thread check their
  // arguments and stop before queueing anything (they return a null Work).
  // The device path checks a call's host counterpart this way on the
  // caller's thread (device_collectives.h), on the group itself: its host
  // group may not have formed yet, and takes the same checks.
  class CheckOnly {
   public:
    CheckOnly();
    ~CheckOnly();
  };

 private:
  // Whether a CheckOnly is alive on this thread.
  static bool checkingOnly();
  // The device path of a call whose tensors are on a device (or, with
  // SMDDP_DEVICE_SIM, on the CPU); null when the call takes the CPU path.
  // Mixed devices, a device other than the group's or than device_id, and
  // CUDA tensors in a build without CUDA get an error naming `coll`.
  // On the CPU path's hot path: no allocation, one device comparison per
  // tensor.
  template <typename... Ts>
  DeviceCollectives* deviceFor(const char* coll, const Ts&... tensorArgs) {
    // A call only checked (the device path's own check, on this group)
    // takes the CPU path's checks.
    if (hostOnly_ || checkingOnly()) return nullptr;
    const at::Tensor* first = nullptr;  // the first defined tensor
    const at::Tensor* other = nullptr;  // the first on another device than `first`
    auto see = [&](const at::Tensor& t) {
      if (!t.defined()) return;
      if (!first) first = &t;
      else if (!other && t.device() != first->device()) other = &t;
    };
    (forEachTensor(see, tensorArgs), ...);
    if (!first || (!other && first->is_cpu() && !cpuOnDevicePath())) return nullptr;
    return deviceForSlow(coll, *first, other);
  }
  template <typename F>
  static void forEachTensor(F& f, const at::Tensor& t) { f(t); }
  template <typename F>
  static void forEachTensor(F& f, const std::vector<at::Tensor>& ts) {
    for (const auto& t : ts) f(t);
  }
  template <typename F>
  static void forEachTensor(F& f, const std::vector<std::vector<at::Tensor>>& ts) {
    for (const auto& l : ts) forEachTensor(f, l);
  }
  DeviceCollectives* deviceForSlow(const char* coll, const at::Tensor& first, const at::Tensor* other);
  // A call on the device path whose `outputs` are written and `inputs` read:
  // `call(pg, hostOutputs, hostInputs)` runs the same collective on their
  // host copies (engine_call.h). `result` is what Work::result() returns.
  template <typename Out, typename In, typename Call>
  c10::intrusive_ptr<c10d::Work> viaDevice(DeviceCollectives* dev, c10d::OpType type,
                                           const char* coll, std::vector<at::Tensor> result,
                                           const Out& outputs, const In& inputs, Call call,
                                           const c10d::ReduceOp* op = nullptr);
  // The same for a call that reads and writes one list (broadcast, reduce).
  // A reduction's `call` takes the op as a fourth (third) argument: its
  // PREMUL_SUM factor mapped to the host (DeviceStage::mapOp).
  template <typename Call>
  c10::intrusive_ptr<c10d::Work> viaDeviceInPlace(DeviceCollectives* dev, c10d::OpType type,
                                                  const char* coll, std::vector<at::Tensor>& tensors,
                                                  Call call, const c10d::ReduceOp* op = nullptr);

  c10::intrusive_ptr<c10d::Work> pointToPoint(std::vector<at::Tensor>& tensors, int peer, int tag,
                                              bool isSend);
  void checkRoot(int64_t root, const char* op) const;
  // Queues the parts of a checked call behind one Work (engine_call.h).
  c10::intrusive_ptr<c10d::Work> submit(c10d::OpType type, const char* title,
                                        std::vector<at::Tensor> outputs,
                                        const std::vector<at::Tensor>& inputs, EngineCall& call);
  c10::intrusive_ptr<c10d::Work> submitParts(c10d::OpType type, const char* title,
                                             std::vector<at::Tensor> outputs,
                                             const std::vector<at::Tensor>& inputs,
                                             EngineCall& call);
  // Runs f (which queues one call and returns its Work): engine errors
  // raised while queueing become DistBackendError, and the Work is recorded
  // when a coalescing block is open.
  template <typename F>
  c10::intrusive_ptr<c10d::Work> guarded(F&& f) {
    try {
      return track(f());
    } catch (const smddp::Error& e) {
      C10_THROW_ERROR(DistBackendError, e.what());
    }
  }
  c10::intrusive_ptr<c10d::Work> track(c10::intrusive_ptr<c10d::Work> work);
  bool coalescingNow() {
    std::lock_guard<std::mutex> lock(coalesceMu_);
    return coalescing_;
  }

  std::unique_ptr<smddp::Communicator> comm_;
  // Every call's failure passes through it (submitParts, pointToPoint,
  // allreduceNow); shared with the Works' completions.
  std::shared_ptr<AsyncError> asyncError_ = std::make_shared<AsyncError>();
  std::string groupName_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::chrono::milliseconds timeout_;
  const bool hostOnly_;  // GroupOptions::hostOnly
  // Handed on to the device path's groups.
  const std::optional<smddp::RegisteredServers> servers_;
  const std::string crossHostDtype_;
  std::atomic<int> shrinks_{0};  // groups shrunk from this one (their store prefixes)
  bool simDevice_ = false;  // SMDDP_DEVICE_SIM: the device path runs on the stand-in
  // Under SMDDP_DEVICE_SIM, the stand-in may also be a torch device
  // ("privateuseone", sim_torch_device.h), whose tensors take the device
  // path; CPU tensors then take the CPU path, as in a CUDA job. Without it,
  // CPU tensors play device memory.
  bool simTorchDevice() const { return simDevice_ && simTorchDeviceEnabled(); }
  bool cpuOnDevicePath() const { return simDevice_ && !simTorchDeviceEnabled(); }
  // The device path's private host-only group where a device path is
  // possible (a GPU is visible, or SMDDP_DEVICE_SIM): it starts to form,
  // on a thread of its own, once this group has (host_group_formation.h).
  std::shared_ptr<HostGroupFormation> hostGroup_;
  std::mutex deviceMu_;
  std::unique_ptr<DeviceCollectives> device_;  // created by the first device call; guarded by deviceMu_
  std::atomic<uint64_t> deviceCalls_{0};
  // Coalescing state. c10d opens and closes a block from one thread, but
  // other threads (DDP hooks, say) may issue calls on the group meanwhile.
  std::mutex coalesceMu_;
  bool coalescing_ = false;                                  // guarded by coalesceMu_
  std::vector<c10::intrusive_ptr<c10d::Work>> coalesced_;    // guarded by coalesceMu_
  // Reads the members above; declared last, so it is built after them.
  const GroupInspector inspector_;
};

}  // namespace c10d_smddp
