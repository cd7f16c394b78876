#include "backend/device_collectives.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "backend/call_support.h"
#include "backend/process_group.h"
#include "backend/work.h"
#include "common/completion_pool.h"
#include "common/error.h"
#include "common/param.h"

namespace c10d_smddp {

SMDDP_PARAM_BYTES(paramDeviceChunkBytes, "SMDDP_DEVICE_CHUNK_BYTES", 4194304, 4096, 1LL << 30,
                  "Chunk (and staging slot) size of the GPU path's allreduce pipeline");

// ---- DeviceWork -------------------------------------------------------------

DeviceWork::DeviceWork(DeviceContext& ctx, int rank, c10d::OpType type, const char* coll,
                       std::vector<at::Tensor> outputs, std::chrono::milliseconds timeout)
    : c10d::Work(rank, type, ("smddp:" + std::string(coll)).c_str()),
      ctx_(ctx),
      title_("smddp:" + std::string(coll)),
      outputs_(std::move(outputs)),
      timeout_(timeout),
      future_(ctx.newFuture()) {}

void DeviceWork::attach(smddp::DeviceEventPtr completion) {
  std::lock_guard<std::mutex> lock(mu_);
  completion_ = std::move(completion);
  if (hostDone_) completeLocked();
}

void DeviceWork::hostFinished(std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(mu_);
  hostDone_ = true;
  error_ = error ? toTorchError(error) : nullptr;
  if (completion_) completeLocked();
}

void DeviceWork::completeLocked() {
  cv_.notify_all();
  // On the completion pool: the future's callbacks are user code (DDP's
  // hooks) that may issue and wait for more collectives, which must never
  // happen on the pipeline thread (common/completion_pool.h).
  auto self = c10::intrusive_ptr<DeviceWork>::reclaim_copy(this);
  smddp::CompletionPool::instance().post([self, error = error_, done = completion_] {
    if (error) {
      self->future_->setError(error);
    } else {
      self->ctx_.completeFuture(self->future_, c10::IValue(self->outputs_), done);
    }
  });
}

bool DeviceWork::wait(std::chrono::milliseconds timeout) {
  const auto limit = timeout == kNoTimeout ? timeout_ : timeout;
  smddp::DeviceEventPtr done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_) std::rethrow_exception(error_);
    done = completion_;
  }
  ctx_.callerWaits(done, limit);
  if (ctx_.blocksHost()) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, limit, [&] { return hostDone_; })) {
      C10_THROW_ERROR(DistBackendError, title_ +
                                            " did not complete within the timeout");
    }
    if (error_) std::rethrow_exception(error_);
  }
  return true;
}

bool DeviceWork::isCompleted() {
  std::lock_guard<std::mutex> lock(mu_);
  return hostDone_ && (error_ || (completion_ && completion_->query()));
}

bool DeviceWork::isSuccess() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hostDone_ && !error_;
}

std::exception_ptr DeviceWork::exception() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

// ---- DeviceStage ------------------------------------------------------------

namespace {

void checkOnDevice(const at::Tensor& t, const c10::Device& device, const char* coll) {
  TORCH_CHECK_VALUE(t.defined(), "smddp ", coll, ": undefined tensor");
  TORCH_CHECK_VALUE(t.device() == device, "smddp ", coll, ": a tensor on ", t.device(),
                    " in a call on ", device);
  TORCH_CHECK_VALUE(t.layout() == at::kStrided && t.is_contiguous(), "smddp ", coll,
                    ": tensors on ", t.device(),
                    " must be dense and contiguous (as with NCCL); call .contiguous() first");
}

}  // namespace

at::Tensor DeviceStage::map(const at::Tensor& t, bool read, bool write) {
  checkOnDevice(t, ctx_.torchDevice(), coll_);
  const size_t bytes = t.nbytes();
  at::Tensor host = ctx_.hostBuffer(bytes).view(t.scalar_type()).view(t.sizes());
  if (bytes > 0 && read) chunk_.in.push_back({t.data_ptr(), host.data_ptr(), bytes});
  if (bytes > 0 && write) chunk_.out.push_back({t.data_ptr(), host.data_ptr(), bytes});
  keep_.push_back(t);
  keep_.push_back(host);
  return host;
}

std::vector<at::Tensor> DeviceStage::map(const std::vector<at::Tensor>& ts, bool read,
                                         bool write) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(map(t, read, write));
  return out;
}

std::vector<std::vector<at::Tensor>> DeviceStage::map(
    const std::vector<std::vector<at::Tensor>>& ts, bool read, bool write) {
  std::vector<std::vector<at::Tensor>> out;
  out.reserve(ts.size());
  for (const auto& list : ts) out.push_back(map(list, read, write));
  return out;
}

// ---- DeviceCollectives --------------------------------------------------------

DeviceCollectives::DeviceCollectives(std::unique_ptr<DeviceContext> ctx,
                                     c10::intrusive_ptr<ProcessGroupSmddp> host, int rank,
                                     std::chrono::milliseconds timeout)
    : ctx_(std::move(ctx)), host_(std::move(host)), rank_(rank), timeout_(timeout) {
  smddp::StagingOptions o;
  o.slotBytes = static_cast<size_t>(paramDeviceChunkBytes());
  // The staging slots together stay within one fusion buffer.
  const int64_t fusion =
      smddp::readBytesParam("SMDDP_FUSION_BUFFER_BYTES", 33554432, 0, 1LL << 34);
  o.slots = static_cast<int>(std::clamp<int64_t>(fusion / static_cast<int64_t>(o.slotBytes), 2, 16));
  o.copyStreams = ctx_->blocksHost() ? 2 : 1;  // the simulation lands chunks out of order
  o.timeout = timeout;
  pipeline_ = std::make_unique<smddp::StagingPipeline>(ctx_->device(), o);
  // Sends and receives each get a pipeline of their own, with no slots: a
  // send waits only for its receiver, so an isend/irecv ring in any order
  // cannot hold up a receive behind a send, or a collective behind either.
  smddp::StagingOptions p2p = o;
  p2p.slots = 1;
  p2p.slotBytes = 4096;
  p2p.copyStreams = 1;
  sendPipe_ = std::make_unique<smddp::StagingPipeline>(ctx_->device(), p2p);
  recvPipe_ = std::make_unique<smddp::StagingPipeline>(ctx_->device(), p2p);
}

DeviceCollectives::~DeviceCollectives() { shutdown(); }

void DeviceCollectives::shutdown() {
  // The host group first: host work stuck in a collective then returns.
  host_->shutdown();
  for (auto* p : {pipeline_.get(), sendPipe_.get(), recvPipe_.get()}) p->shutdown();
  std::lock_guard<std::mutex> lock(inFlightMu_);
  inFlight_.clear();
}

void DeviceCollectives::checkUsable(const char* coll) const {
  for (auto* p : {pipeline_.get(), sendPipe_.get(), recvPipe_.get()}) {
    auto cause = p->broken();
    if (!cause) continue;
    // Every call after a failure fails at once, with the first cause.
    std::rethrow_exception(toTorchError(cause));
  }
}

c10::intrusive_ptr<c10d::Work> DeviceCollectives::staged(c10d::OpType type, const char* coll,
                                                         std::vector<at::Tensor> outputs,
                                                         const Plan& plan, Lane lane) {
  checkUsable(coll);
  DeviceStage stage(*ctx_, coll);
  HostCall call = plan(stage);
  {
    // The CPU path's own argument checks, on the caller's thread.
    ProcessGroupSmddp::CheckOnly check;
    (void)call(*host_);
  }
  stage.chunk_.host = [host = host_, call](void*) {
    if (auto w = call(*host)) w->wait();
  };
  smddp::StagingCall sc;
  sc.what = coll;
  sc.chunks.push_back(std::move(stage.chunk_));
  smddp::StagingPipeline& pipe =
      lane == Lane::kSend ? *sendPipe_ : lane == Lane::kRecv ? *recvPipe_ : *pipeline_;
  return launch(pipe, type, coll, std::move(outputs), std::move(stage.keep_), std::move(sc));
}

c10::intrusive_ptr<c10d::Work> DeviceCollectives::allreduce(c10d::OpType type, const char* coll,
                                                            std::vector<at::Tensor>& tensors,
                                                            const c10d::AllreduceOptions& opts) {
  checkUsable(coll);
  TORCH_CHECK_VALUE(!tensors.empty(), "smddp ", coll, ": no tensors given");
  const at::ScalarType st = tensors[0].scalar_type();
  for (const auto& t : tensors) {
    checkOnDevice(t, ctx_->torchDevice(), coll);
    TORCH_CHECK_TYPE(t.scalar_type() == st, "smddp ", coll,
                     ": all tensors must have the same dtype (got ", st, " and ",
                     t.scalar_type(), ")");
  }
  std::optional<double> factor;  // dtype and op, with the CPU path's checks and messages
  (void)toReduceOpScaled(opts.reduceOp, toDataType(tensors[0], coll), coll, &factor);
  c10d::AllreduceOptions hostOpts = opts;
  hostOpts.asyncOp = false;  // the pipeline thread waits at once
  const size_t elem = tensors[0].element_size();
  const size_t chunkBytes = std::max(elem, pipeline_->slotBytes() / elem * elem);

  smddp::StagingCall sc;
  sc.what = coll;
  smddp::StagingChunk cur;
  size_t used = 0;
  auto flush = [&] {
    if (used == 0) return;
    cur.slotted = true;
    cur.out = cur.in;  // in place: each piece goes back where it came from
    const int64_t numel = static_cast<int64_t>(used / elem);
    cur.host = [host = host_, numel, st, hostOpts](void* slot) {
      std::vector<at::Tensor> v{at::from_blob(slot, {numel}, at::TensorOptions().dtype(st))};
      if (auto w = host->allreduce(v, hostOpts)) w->wait();
    };
    sc.chunks.push_back(std::move(cur));
    cur = smddp::StagingChunk{};
    used = 0;
  };
  for (const auto& t : tensors) {
    auto* base = static_cast<uint8_t*>(t.data_ptr());
    const size_t bytes = t.nbytes();
    for (size_t off = 0; off < bytes;) {
      const size_t n = std::min(bytes - off, chunkBytes - used);
      cur.in.push_back({base + off, reinterpret_cast<void*>(used), n});
      used += n;
      off += n;
      if (used == chunkBytes) flush();
    }
  }
  flush();
  return launch(*pipeline_, type, coll, tensors, std::vector<at::Tensor>(tensors),
                std::move(sc));
}

c10::intrusive_ptr<c10d::Work> DeviceCollectives::launch(smddp::StagingPipeline& pipe,
                                                         c10d::OpType type, const char* coll,
                                                         std::vector<at::Tensor> outputs,
                                                         std::vector<at::Tensor> keep,
                                                         smddp::StagingCall call) {
  auto work = c10::make_intrusive<DeviceWork>(*ctx_, rank_, type, coll, std::move(outputs),
                                              timeout_);
  call.ready = ctx_->callerReady();
  for (const auto& t : keep) {
    if (t.device() == ctx_->torchDevice()) ctx_->protect(t);
  }
  call.done = [work](std::exception_ptr e) { work->hostFinished(e); };
  smddp::DeviceEventPtr completion;
  try {
    completion = pipe.submit(std::move(call));
  } catch (const smddp::Error& e) {
    rethrowAsTorch(e);
  }
  work->attach(completion);
  // The call's tensors (device ones and their host copies) stay referenced
  // until its last copy back has landed, even if the Work is dropped first.
  std::lock_guard<std::mutex> lock(inFlightMu_);
  inFlight_.erase(std::remove_if(inFlight_.begin(), inFlight_.end(),
                                 [](const auto& f) { return f.first->query(); }),
                  inFlight_.end());
  inFlight_.emplace_back(completion, std::move(keep));
  return work;
}

}  // namespace c10d_smddp
