#include "backend/process_group.h"

#include <c10/util/Exception.h>

#include <mutex>
#include <set>

#include "backend/call_support.h"
#include "backend/device_collectives.h"
#include "backend/sim_context.h"
#include "backend/sim_torch_device.h"
#include "backend/engine_call.h"
#include "backend/host_group_formation.h"
#include "backend/store_bootstrap.h"
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include "backend/work.h"
#include "common/error.h"
#include "hostpath/allreduce_paths.h"
#include "observe/timeline.h"

namespace c10d_smddp {

namespace {

// The live groups of this process, for shutdownAll.
std::mutex gLiveMu;
std::set<ProcessGroupSmddp*> gLive;  // guarded by gLiveMu

thread_local int tCheckOnly = 0;

}  // namespace

ProcessGroupSmddp::CheckOnly::CheckOnly() { ++tCheckOnly; }
ProcessGroupSmddp::CheckOnly::~CheckOnly() { --tCheckOnly; }
bool ProcessGroupSmddp::checkingOnly() { return tCheckOnly > 0; }

ProcessGroupSmddp::ProcessGroupSmddp(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                     int size, std::chrono::milliseconds timeout,
                                     std::string groupName, GroupOptions options)
    : c10d::Backend(rank, size),
      groupName_(std::move(groupName)),
      store_(store),
      timeout_(timeout),
      hostOnly_(options.hostOnly),
      servers_(options.servers),
      crossHostDtype_(options.crossHostDtype),
      inspector_({comm_, asyncError_, hostGroup_, deviceMu_, device_, deviceCalls_, rank, size}) {
  if (!hostOnly_) simDevice_ = deviceSimRequested();
  // SMDDP_TIMELINE: the first group of the process (the world group) opens
  // the file named after its rank.
  smddp::timeline::configure(rank);
  StoreBootstrap boot(store, options.cancel);
  smddp::CommOptions opts;
  opts.rank = rank;
  opts.size = size;
  opts.timeout = timeout;
  opts.name = groupName_;
  opts.servers = servers_;
  opts.crossHostDtype = crossHostDtype_;
  opts.keepSpare = options.keepSpare;
  try {
    comm_ = std::make_unique<smddp::Communicator>(boot, opts, smddp::standardEngineParts());
    WorkSmddp::setDefaultSpin(std::chrono::microseconds(comm_->config().spinUs));
  } catch (const smddp::Error& e) {
    if (e.kind() == smddp::ErrorKind::kInvalidArgument) TORCH_CHECK_VALUE(false, e.what());
    rethrowAsTorch(e);
  }
  if (!hostOnly_ && (simDevice_ || cudaDeviceCount() > 0)) {
    // A private host-only group carries the device calls' CPU collectives,
    // in the order the device calls were made (device_collectives.h). It
    // forms on a thread of its own, started now on every rank, so creating
    // the group waits for one rendezvous (host_group_formation.h); a
    // shutdown cancels it.
    options.hostOnly = true;
    options.cancel = nullptr;
    hostGroup_ = std::make_shared<HostGroupFormation>(
        groupName_ + "/device", size_, timeout_,
        [store = c10::make_intrusive<c10d::PrefixStore>("device", store_), rank = rank_,
         size = size_, timeout = timeout_, name = groupName_ + "/device",
         options = std::move(options)](std::shared_ptr<FormationCancel> cancel) {
          GroupOptions o = options;
          o.cancel = std::move(cancel);
          return c10::make_intrusive<ProcessGroupSmddp>(store, rank, size, timeout, name, o);
        });
    hostGroup_->start();
  }
  // A device path's host group is shut down with its group. It may form on
  // a thread that the group's shutdown joins, under shutdownAll's lock.
  if (hostOnly_) return;
  std::lock_guard<std::mutex> lock(gLiveMu);
  gLive.insert(this);
}

ProcessGroupSmddp::~ProcessGroupSmddp() {
  {
    std::lock_guard<std::mutex> lock(gLiveMu);
    gLive.erase(this);
  }
  shutdown();
  // Its engine thread got stuck in the transport and still uses it: leak it.
  if (comm_ && comm_->stuck()) (void)comm_.release();
}

void ProcessGroupSmddp::shutdownAll() {
  std::lock_guard<std::mutex> lock(gLiveMu);
  for (ProcessGroupSmddp* pg : gLive) pg->shutdown();
}

void ProcessGroupSmddp::abort() {
  asyncError_->record(smddp::ErrorKind::kAborted, "smddp: the group was aborted");
  shutdown();
}

c10d::ErrorType ProcessGroupSmddp::getError() {
  if (hostGroup_ && hostGroup_->failure()) return c10d::ErrorType::COMM_ERROR;
  if (auto host = hostGroup_ ? hostGroup_->formed() : nullptr) {
    const c10d::ErrorType e = host->getError();  // once: it may change between two reads
    if (e != c10d::ErrorType::SUCCESS) return e;
  }
  return asyncError_->type();
}

void ProcessGroupSmddp::shutdown() {
  {
    std::lock_guard<std::mutex> lock(deviceMu_);
    if (device_) device_->shutdown();
  }
  if (hostGroup_) hostGroup_->shutdown();
  // Orderly unless the group failed or was aborted.
  if (comm_) comm_->shutdown(getError() == c10d::ErrorType::SUCCESS);
  // destroy_process_group() and exit leave a complete timeline file.
  smddp::timeline::flush();
}

DeviceCollectives* ProcessGroupSmddp::deviceForSlow(const char* coll, const at::Tensor& first,
                                                    const at::Tensor* other) {
  if (other) {
    TORCH_CHECK_VALUE(false, "smddp ", coll, ": all tensors of one call must be on one device, got ",
                      first.device(), " and ", other->device());
  }
  const c10::Device dev = first.device();
  if (!dev.is_cpu() && !(dev.is_privateuseone() && simTorchDevice())) {
    TORCH_CHECK_VALUE(dev.is_cuda(), "smddp ", coll, ": tensors on ", dev,
                      " are not supported (CPU and CUDA tensors are)");
    TORCH_CHECK_VALUE(builtWithCuda(), "smddp ", coll, ": got a tensor on ", dev,
                      ", but this build of torch_smddp has no CUDA support. Build it with "
                      "SMDDP_WITH_CUDA=ON against a CUDA build of torch (docs/gpu.md).");
    auto bound = getBoundDeviceId();
    TORCH_CHECK_VALUE(!bound || !bound->has_index() || !dev.has_index() || *bound == dev,
                      "smddp ", coll, ": a tensor on ", dev, " but this group was bound to ",
                      *bound, " (device_id)");
  }
  std::lock_guard<std::mutex> lock(deviceMu_);
  if (!device_) {
    TORCH_CHECK(hostGroup_, "smddp ", coll, ": a tensor on ", dev, " but this group was made "
                "without a device path (no CUDA device was visible when it was created)");
    std::shared_ptr<DeviceContext> ctx =
        dev.is_cuda() ? makeCudaContext(dev.has_index() ? dev.index() : currentCudaDevice())
                      : makeSimContext(timeout_, dev);
    IntraSetup intra;
    intra.store = store_;
    intra.rank = rank_;
    intra.size = size_;
    intra.ranksByHost = comm_->peers().ranksByHost();
    intra.groupName = groupName_;
    intra.instance = comm_->storePrefix();
    intra.timeout = timeout_;
    intra.sim = !dev.is_cuda();
    intra.servers = servers_;
    intra.crossHostDtype = crossHostDtype_;
    device_ = std::make_unique<DeviceCollectives>(std::move(ctx), hostGroup_, *this, rank_,
                                                  timeout_, std::move(intra));
  }
  TORCH_CHECK_VALUE(device_->device() == dev || (dev.is_cuda() && !dev.has_index()), "smddp ",
                    coll, ": this group runs on ", device_->device(), "; got a tensor on ", dev,
                    " (one device per rank, as with NCCL)");
  deviceCalls_.fetch_add(1, std::memory_order_relaxed);
  return device_.get();
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::track(c10::intrusive_ptr<c10d::Work> work) {
  std::lock_guard<std::mutex> lock(coalesceMu_);
  if (coalescing_ && work) coalesced_.push_back(work);  // null: a call only checked
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
  std::shared_ptr<DeviceContext> deviceCtx;
  for (const auto& w : works) {
    if (dynamic_cast<DeviceWork*>(w.get())) {
      std::lock_guard<std::mutex> lock(deviceMu_);
      if (device_) deviceCtx = device_->context();
    }
  }
  if (deviceCtx) {
    // Device calls in the block: one Work with their stream semantics.
    auto work = coalescedDeviceWork(std::move(deviceCtx), rank_, works, timeout_);
    return work;
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
  if (auto* dev = deviceFor("all_reduce", tensors)) {
    return track(dev->allreduce(c10d::OpType::ALLREDUCE, "all_reduce", tensors, opts));
  }
  checkTensor(tensors[0], "all_reduce");
  DataType dt = toDataType(tensors[0], "all_reduce");
  std::optional<double> factor;
  auto op = toReduceOpScaled(opts.reduceOp, dt, "all_reduce", &factor);
  EngineCall call(opts);
  Buffer b = bufferOf(call.staging.stageInPlace(tensors[0], factor));
  call.parts.push_back([&](smddp::Communicator::Done done, smddp::CallHooks hooks) {
    hooks.touches = {extentOf(tensors[0])};  // the user's storage, not the staging copy
    return comm_->allreduce({b}, dt, op, std::move(done), std::move(hooks));
  });
  return submit(c10d::OpType::ALLREDUCE, "smddp:all_reduce", tensors, tensors, call);
}

bool ProcessGroupSmddp::allreduceNow(at::Tensor& tensor, const c10d::ReduceOp& reduceOp) {
  if (!comm_ || cpuOnDevicePath() || checkingOnly() || !tensor.defined() || !tensor.device().is_cpu() ||
      tensor.layout() != at::kStrided || !tensor.is_contiguous() ||
      reduceOp.op_ == c10d::ReduceOp::PREMUL_SUM || C10_UNLIKELY(at::hasCallbacks())) {
    return false;
  }
  // Complex (viewed as real by dist.all_reduce) or unsupported: c10d's way.
  const std::optional<DataType> engineDt = engineDataType(tensor.scalar_type());
  if (!engineDt || coalescingNow()) return false;
  const DataType dt = *engineDt;
  const smddp::ReduceOp op = toReduceOp(reduceOp, dt, "all_reduce");  // names an unsupported pair
  try {
    comm_->allreduceSync({bufferOf(tensor)}, dt, op, {extentOf(tensor)});
  } catch (const smddp::Error& e) {
    asyncError_->note(std::current_exception());
    C10_THROW_ERROR(DistBackendError, e.what());
  }
  return true;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK_VALUE(!tensors.empty(), "smddp all_reduce_coalesced: no tensors given");
  if (auto* dev = deviceFor("all_reduce_coalesced", tensors)) {
    c10d::AllreduceOptions one;
    one.reduceOp = opts.reduceOp;
    one.timeout = opts.timeout;
    return track(dev->allreduce(c10d::OpType::ALLREDUCE_COALESCED, "all_reduce_coalesced", tensors,
                                one));
  }
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
  // wherever they do not overlap. Each part copies its staged result back
  // when it completes, before a later part on that memory reads it.
  EngineCall call(opts);
  for (size_t i = 0; i < tensors.size(); ++i) {
    Buffer b = bufferOf(call.staging.stageInPlace(tensors[i], factor, i));
    smddp::MemRange user = extentOf(tensors[i]);
    call.parts.push_back([this, b, user, dt, op](smddp::Communicator::Done done,
                                                 smddp::CallHooks hooks) {
      hooks.touches = {user};
      return comm_->allreduce({b}, dt, op, std::move(done), std::move(hooks));
    });
  }
  return submit(c10d::OpType::ALLREDUCE_COALESCED, "smddp:all_reduce_coalesced", tensors, tensors,
                call);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::broadcast(std::vector<at::Tensor>& tensors,
                                                            const c10d::BroadcastOptions& opts) {
  TORCH_CHECK_VALUE(tensors.size() == 1, "smddp broadcast takes exactly one tensor per call, got ",
                    tensors.size());
  TORCH_CHECK_VALUE(opts.rootRank >= 0 && opts.rootRank < size_, "smddp broadcast: root rank ",
                    opts.rootRank, " is outside the group of size ", size_);
  TORCH_CHECK_VALUE(opts.rootTensor == 0, "smddp broadcast: rootTensor must be 0");
  if (auto* dev = deviceFor("broadcast", tensors)) {
    return viaDeviceInPlace(dev, c10d::OpType::BROADCAST, "broadcast", tensors,
                            [opts](ProcessGroupSmddp& pg, auto& h) { return pg.broadcast(h, opts); });
  }
  checkTensor(tensors[0], "broadcast");
  DataType dt = toMovedDataType(tensors[0], "broadcast");
  const int root = static_cast<int>(opts.rootRank);
  EngineCall call(opts);
  // The root reads its tensor, the others write theirs.
  Buffer b = bufferOf(call.staging.stage(tensors[0], rank_ == root ? Use::kIn : Use::kOut));
  call.parts.push_back([&](smddp::Communicator::Done done, smddp::CallHooks hooks) {
    return smddp::broadcast(*comm_, {b}, dt, root, std::move(done), std::move(hooks));
  });
  return submit(c10d::OpType::BROADCAST, "smddp:broadcast", tensors, tensors, call);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  TORCH_CHECK_VALUE(inputs.size() == 1 && outputs.size() == 1,
                    "smddp all_gather takes one input tensor and one output list");
  if (auto* dev = deviceFor("all_gather", outputs, inputs)) {
    if (auto w = dev->allgatherList(outputs[0], inputs[0])) return track(w);
    return viaDevice(dev, c10d::OpType::ALLGATHER, "all_gather", outputs[0], outputs, inputs,
                     [opts](ProcessGroupSmddp& pg, auto& out, auto& in) {
                       return pg.allgather(out, in, opts);
                     });
  }
  TORCH_CHECK_VALUE(static_cast<int>(outputs[0].size()) == size_, "smddp all_gather: the output "
                    "list has length ", outputs[0].size(), " but the world size is ", size_);
  const at::Tensor& in = inputs[0];
  checkTensor(in, "all_gather");
  DataType dt = toMovedDataType(in, "all_gather");
  EngineCall call(opts);
  Buffer inB = gatherInputOf(call.staging.stage(in, Use::kIn));
  std::vector<Buffer> outs;
  for (const auto& o : outputs[0]) {
    checkTensor(o, "all_gather");
    TORCH_CHECK_TYPE(o.scalar_type() == in.scalar_type(), "smddp all_gather: output dtype ",
                     o.scalar_type(), " differs from input dtype ", in.scalar_type());
    TORCH_CHECK_VALUE(o.numel() == in.numel(), "smddp all_gather: output tensor size (", o.numel(),
                      " elements) differs from the input size (", in.numel(), " elements)");
    outs.push_back(bufferOf(call.staging.stage(o, Use::kOut)));
  }
  call.parts.push_back([&](smddp::Communicator::Done done, smddp::CallHooks hooks) {
    return smddp::allgather(*comm_, inB, outs, dt, std::move(done), std::move(hooks));
  });
  return submit(c10d::OpType::ALLGATHER, "smddp:all_gather", outputs[0], inputs, call);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  const char* name = "all_gather_into_tensor";
  if (auto* dev = deviceFor(name, output, input)) {
    if (auto w = dev->allgatherBase(output, input)) return track(w);
    return viaDevice(dev, c10d::OpType::_ALLGATHER_BASE, name, {output}, output, input,
                     [opts](ProcessGroupSmddp& pg, auto& out, auto& in) {
                       return pg._allgather_base(out, in, opts);
                     });
  }
  DataType dt = checkWholeAndPart(output, input, /*outputIsWhole=*/true, size_, name);
  EngineCall call(opts);
  Buffer inB = gatherInputOf(call.staging.stage(input, Use::kIn));
  std::vector<Buffer> outs = slices(call.staging.stage(output, Use::kOut), size_, input.numel());
  call.parts.push_back([&](smddp::Communicator::Done done, smddp::CallHooks hooks) {
    return smddp::allgather(*comm_, inB, outs, dt, std::move(done), std::move(hooks));
  });
  return submit(c10d::OpType::_ALLGATHER_BASE, "smddp:all_gather_into_tensor", {output}, {input},
                call);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupSmddp::barrier(const c10d::BarrierOptions& opts) {
  if (checkingOnly()) return {};  // nothing to check
  DeviceCollectives* dev = nullptr;
  {
    std::lock_guard<std::mutex> lock(deviceMu_);
    dev = device_.get();
  }
  if (!dev && hostGroup_ && !hostOnly_) {
    // The group has a device path on every rank, so its barrier takes it on
    // every rank, as NCCL's barrier runs on a GPU, whether or not this rank
    // has made a device call yet. (Before, such a rank ran its barrier on
    // the CPU path while those with a device call ran it on the private
    // host group, and the two never met.) The device: device_ids', the
    // group's bound one, or the current one; torch passes the backend no
    // other.
    c10::Device where(c10::kCPU);
    if (simTorchDevice()) {
      where = c10::Device(c10::kPrivateUse1, currentSimTorchDevice());
    } else if (!simDevice_) {
      const auto bound = getBoundDeviceId();
      c10::DeviceIndex index = currentCudaDevice();
      if (!opts.device_ids.empty()) index = static_cast<c10::DeviceIndex>(opts.device_ids[0]);
      else if (bound && bound->has_index()) index = bound->index();
      where = c10::Device(c10::kCUDA, index);
    }
    dev = deviceFor("barrier", at::empty({0}, at::TensorOptions().device(where).dtype(at::kByte)));
  }
  if (dev && !hostOnly_) {
    // As NCCL's: a barrier also orders device work. It runs behind every
    // collective issued before it, and its wait() returns once their
    // copies back, those of this rank's earlier sends and receives (which
    // it does not hold up) and the caller's stream have run.
    return track(dev->behindP2P(dev->staged(
        c10d::OpType::BARRIER, "barrier", {},
        [opts](DeviceStage&) -> DeviceCollectives::HostCall {
          return [opts](ProcessGroupSmddp& pg) { return pg.barrier(opts); };
        },
        DeviceCollectives::Lane::kCollective, /*syncOnWait=*/true)));
  }
  EngineCall call(opts);
  call.parts.push_back([&](smddp::Communicator::Done done, smddp::CallHooks) {
    return smddp::barrier(*comm_, std::move(done));
  });
  return submit(c10d::OpType::BARRIER, "smddp:barrier", {}, {}, call);
}

}  // namespace c10d_smddp
