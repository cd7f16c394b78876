#include "backend/device_collectives.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <set>
#include <thread>

#include "backend/call_support.h"
#include "backend/liveness_grace.h"
#include "backend/process_group.h"
#include "backend/work.h"
#include "common/caller_waiting.h"
#include "common/completion_pool.h"
#include "common/error.h"
#include "common/param.h"
#include "device/reaper.h"

namespace c10d_smddp {

SMDDP_PARAM_BYTES(paramDeviceChunkBytes, "SMDDP_DEVICE_CHUNK_BYTES", 4194304, 4096, 1LL << 30,
                  "Chunk (and staging slot) size of the GPU path's allreduce pipeline");
SMDDP_PARAM_BYTES(paramDeviceMinPiece, "SMDDP_DEVICE_MIN_PIECE_BYTES", 262144, 4096, 1LL << 26,
                  "Least bytes per rank in each staged piece of the GPU path's all-gather and "
                  "reduce-scatter: the staging slots grow to hold world + 1 such pieces (up to "
                  "64 MiB) where SMDDP_DEVICE_CHUNK_BYTES holds fewer");
// 512 MiB: a repeated whole-staged call of a few hundred MB (DDP's 250 MB
// buckets, broadcast at start) keeps its buffer (device/host_pool.h).
SMDDP_PARAM_BYTES(paramDeviceHostCache, "SMDDP_DEVICE_HOST_CACHE_BYTES", 536870912, 0, 1LL << 40,
                  "Page-locked memory a group keeps for reuse by the GPU path's whole-staged calls "
                  "(the longest-idle buffers make room for the latest)");

namespace {

// A staging slot holds, for all-gather and reduce-scatter, one piece of
// every rank's part and this rank's own: world + 1 pieces. At large worlds
// the configured chunk would cut pieces to a few KiB, each a host
// collective of its own with world - 1 steps (issue 53, 8): the slot grows
// to hold pieces of at least SMDDP_DEVICE_MIN_PIECE_BYTES, up to 64 MiB
// (2 slots at least, so 128 MiB of page-locked memory at most).
size_t stagingSlotBytes(int world) {
  constexpr size_t kMaxSlotBytes = 64u << 20;
  const auto chunk = static_cast<size_t>(paramDeviceChunkBytes());
  const size_t pieces = static_cast<size_t>(world) + 1;
  const size_t want = pieces * static_cast<size_t>(paramDeviceMinPiece());
  return std::max(chunk, std::min(want, kMaxSlotBytes));
}

void checkOnDevice(const at::Tensor& t, const c10::Device& device, const char* coll) {
  TORCH_CHECK_VALUE(t.defined(), "smddp ", coll, ": undefined tensor");
  TORCH_CHECK_VALUE(t.device() == device, "smddp ", coll, ": a tensor on ", t.device(),
                    " in a call on ", device);
  TORCH_CHECK_VALUE(t.layout() == at::kStrided && t.is_non_overlapping_and_dense(), "smddp ", coll,
                    ": tensors on ", t.device(),
                    " must be dense and non-overlapping (as with NCCL); call .contiguous() first");
}

// The bytes a dense, non-overlapping tensor spans, from its data pointer.
size_t spanBytes(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

}  // namespace

// ---- DeviceStage ------------------------------------------------------------

at::Tensor DeviceStage::map(const at::Tensor& t, bool read, bool write) {
  checkOnDevice(t, ctx_.torchDevice(), coll_);
  const size_t bytes = spanBytes(t);
  std::shared_ptr<void> buffer = pool_.acquire(bytes);
  void* host = buffer.get();
  at::Tensor h = at::from_blob(
      host, t.sizes(), t.strides(), [buffer](void*) mutable { buffer.reset(); },
      at::TensorOptions().dtype(t.scalar_type()).device(at::kCPU));
  if (bytes > 0 && read) chunk_.in.push_back({t.data_ptr(), host, bytes});
  if (bytes > 0 && write) chunk_.out.push_back({t.data_ptr(), host, bytes});
  if (read) read_.push_back(t);
  if (write) written_.push_back(t);
  keep_.push_back(t);
  keep_.push_back(h);
  return h;
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

c10d::ReduceOp DeviceStage::mapOp(const c10d::ReduceOp& op) {
  if (op.op_ != c10d::ReduceOp::PREMUL_SUM) return op;
  auto* sup = dynamic_cast<PreMulSumSupplement*>(op.supplement_.get());
  if (!sup || !sup->tensor_factor.defined() || sup->tensor_factor.device() != ctx_.torchDevice()) {
    return op;
  }
  TORCH_CHECK_VALUE(sup->tensor_factor.numel() == 1, "smddp ", coll_,
                    ": the PREMUL_SUM factor tensor must have one element, got ",
                    sup->tensor_factor.numel());
  return makePreMulSum(map(sup->tensor_factor, /*read=*/true, /*write=*/false));
}

// ---- Watch ----------------------------------------------------------------------

// A failure must reach the failing call within about the time the host
// route takes, also on the NCCL route, where a peer that died leaves the
// survivors' reduce-scatter waiting on the device for good (no error says
// so) and the ranks of another host waiting on the rail for them. So the
// collective pipeline's thread, while it waits for copies in or for the
// rail, checks every few ms that every rank of the group lives (the host
// group's liveness: same-host owner locks, the peer monitor across hosts)
// and that the intra-host communicator has no asynchronous error; and when
// the pipeline breaks, for whatever reason, it aborts the communicator and
// the rail's collective in flight before it drains. Shared with that
// thread, which a shutdown may leave behind.
class DeviceCollectives::Watch {
 public:
  // `group`'s liveness: the ranks of the host group, watched before it
  // has formed too. close() comes before the group goes.
  explicit Watch(const ProcessGroupSmddp& group) : group_(group) {}

  void setRoute(std::shared_ptr<IntraRoute> route) {
    std::lock_guard<std::mutex> lock(mu_);
    route_ = std::move(route);
  }
  // Throws when a rank is gone or the communicator failed (pipeline thread).
  void check(const std::string& during) {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    group_.inspect().checkPeersAlive(during);
    if (route_) route_->host->checkHealthy();
  }
  // The pipeline broke: end the work that can never complete.
  void broken() {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || !route_) return;
    route_->host->abort();
    route_->rail->shutdown();
  }
  // The groups shut down next: no check may touch them from now on.
  void close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }

 private:
  std::mutex mu_;
  const ProcessGroupSmddp& group_;
  std::shared_ptr<IntraRoute> route_;  // guarded by mu_
  bool closed_ = false;                // guarded by mu_
};

// Waits for `work` as wait() does, running `watch` every few ms meanwhile.
void waitWatched(c10d::Work& work, DeviceCollectives::Watch& watch, const std::string& during) {
  smddp::CallerWaiting waiting;  // the engine may poll meanwhile
  auto next = std::chrono::steady_clock::now() + std::chrono::milliseconds(2);
  auto nap = std::chrono::microseconds(1);
  while (!work.isCompleted()) {
    if (std::chrono::steady_clock::now() >= next) {
      watch.check(during);
      next = std::chrono::steady_clock::now() + std::chrono::milliseconds(2);
    }
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(100));
  }
  try {
    work.wait();  // its error, if any
  } catch (...) {
    // A rank the group lost is named as the group numbers it, not as the
    // rail does ("rank 1 of group 0/rail1" is the group's rank 3). The
    // group's own liveness may see the death a moment after the rail's.
    giveLivenessItsMoment([&] { watch.check(during); }, std::chrono::milliseconds(2));
    throw;
  }
}

ProcessGroupSmddp& formedHost(HostGroupFormation& host, DeviceCollectives::Watch& watch) {
  return *host.get([&] { watch.check("the device path's host group forming"); });
}

// ---- DeviceCollectives --------------------------------------------------------

DeviceCollectives::DeviceCollectives(std::shared_ptr<DeviceContext> ctx,
                                     std::shared_ptr<HostGroupFormation> host, ProcessGroupSmddp& group,
                                     int rank, std::chrono::milliseconds timeout, IntraSetup intra)
    : ctx_(std::move(ctx)), host_(std::move(host)), group_(group), rank_(rank), world_(host_->size()),
      timeout_(timeout), intraSetup_(std::move(intra)) {
  auto entered = ctx_->enter();  // the slots are allocated on the device
  pool_ = smddp::HostBufferPool::make(ctx_->device(), static_cast<size_t>(paramDeviceHostCache()));
  smddp::StagingOptions o;
  o.slotBytes = stagingSlotBytes(world_);
  // The staging slots together stay within one fusion buffer.
  const int64_t fusion =
      smddp::readBytesParam("SMDDP_FUSION_BUFFER_BYTES", 33554432, 0, 1LL << 34);
  o.slots = static_cast<int>(std::clamp<int64_t>(fusion / static_cast<int64_t>(o.slotBytes), 2, 16));
  o.timeout = timeout;
  o.inStream = 0;
  o.outStream = 1;
  watch_ = std::make_shared<Watch>(group_);
  intraSetup_.alive = [watch = watch_] { watch->check("setting up the intra-host route"); };
  smddp::StagingOptions collective = o;
  collective.watch = [watch = watch_](const std::string& what) { watch->check(what); };
  collective.onBroken = [watch = watch_](std::exception_ptr) { watch->broken(); };
  pipeline_ = std::make_unique<smddp::StagingPipeline>(ctx_->device(), collective);
  // Sends and receives get pipelines of their own, with no slots, one per
  // direction and peer, made at first use: a send waits only for its
  // receiver and the sends before it to that peer, so an isend/irecv ring
  // in any order cannot hold up a receive behind a send, a collective
  // behind either, or a send to one peer behind a send to a late one
  // (issue 53, defect 6). No device queue waits for the host, so they may
  // share streams.
  p2pOptions_ = o;
  p2pOptions_.slots = 0;
}

smddp::StagingPipeline& DeviceCollectives::p2pLane(Lane lane, int peer) {
  std::lock_guard<std::mutex> lock(p2pMu_);
  auto& p = p2pLanes_[{lane, peer}];
  if (!p) {
    smddp::StagingOptions o = p2pOptions_;
    o.inStream = lane == Lane::kSend ? 2 : 3;
    p = std::make_unique<smddp::StagingPipeline>(ctx_->device(), o);
  }
  return *p;
}

std::vector<smddp::StagingPipeline*> DeviceCollectives::pipelines() const {
  std::lock_guard<std::mutex> lock(p2pMu_);
  std::vector<smddp::StagingPipeline*> all{pipeline_.get()};
  for (const auto& [key, p] : p2pLanes_) all.push_back(p.get());
  return all;
}

DeviceCollectives::~DeviceCollectives() { shutdown(); }

void DeviceCollectives::shutdown() {
  watch_->close();
  // The host groups first: host work stuck in a collective then returns.
  host_->shutdown();
  std::shared_ptr<IntraRoute> intra = std::atomic_load(&intra_);
  if (intra) {
    intra->host->abort();
    intra->rail->shutdown();
  }
  for (auto* p : pipelines()) p->shutdown();
  {
    auto entered = ctx_->enter();  // freeing page-locked memory is a CUDA call
    pool_->clear();
  }
  if (intra && intra->stream) {
    // The communicator's stream goes once its work has run (the abort ended
    // its kernels); the route keeps it for a pipeline thread left behind.
    try {
      auto entered = ctx_->enter();
      smddp::DeviceReaper::of(ctx_->device()).release(intra->stream->record(), intra->stream);
    } catch (const std::exception& e) {
      smddp::DeviceReaper::keepForever(intra->stream);
    }
  }
  if (intra && !intra->scratch.empty()) {
    // The shards' device memory goes once the copy streams have drained.
    try {
      auto entered = ctx_->enter();
      smddp::Device& d = *ctx_->device();
      smddp::DeviceEventPtr in = d.poolStream(0).record();
      d.poolStream(1).wait(in);
      auto& reaper = smddp::DeviceReaper::of(ctx_->device());
      reaper.release(in, nullptr);
      reaper.release(d.poolStream(1).record(),
                     std::make_shared<std::vector<at::Tensor>>(std::move(intra->scratch)));
    } catch (const std::exception& e) {
      smddp::DeviceReaper::keepForever(std::make_shared<std::vector<at::Tensor>>(std::move(intra->scratch)));
    }
  }
}

std::shared_ptr<IntraRoute> DeviceCollectives::intraRouteFor() {
  std::call_once(intraOnce_, [&] {
    std::string why;
    std::shared_ptr<IntraRoute> route;
    try {
      route = makeIntraRoute(intraSetup_, *ctx_, pipeline_->slotBytes(), pipeline_->slots(), &why);
    } catch (...) {
      // The route forms once, with every rank of the group: a failed
      // formation is remembered, and every later call fails with its error
      // rather than forming again alone (call_once would run this again
      // after a throw; issue 53, defect 8).
      std::lock_guard<std::mutex> lock(intraMu_);
      intraError_ = std::current_exception();
      return;
    }
    {
      std::lock_guard<std::mutex> lock(intraMu_);
      intraWhy_ = why;
    }
    watch_->setRoute(route);
    std::atomic_store(&intra_, route);
  });
  {
    std::lock_guard<std::mutex> lock(intraMu_);
    if (intraError_) std::rethrow_exception(intraError_);
  }
  return std::atomic_load(&intra_);
}

std::string DeviceCollectives::intraRoute() const {
  if (std::atomic_load(&intra_)) return "nccl";
  std::lock_guard<std::mutex> lock(intraMu_);
  return intraWhy_.empty() ? "" : "shm";
}

void DeviceCollectives::checkUsable(const char* coll) const {
  for (auto* p : pipelines()) {
    auto cause = p->broken();
    if (!cause) continue;
    // Every call after a failure fails at once, with the first cause.
    std::rethrow_exception(toTorchError(cause));
  }
}

void DeviceCollectives::checkNotCapturing(const char* coll) {
  auto entered = ctx_->enter();
  TORCH_CHECK(!ctx_->capturing(), "smddp ", coll, ": called while the current stream of ",
              ctx_->torchDevice(), " captures a CUDA graph. smddp reduces on the host, which a "
              "graph cannot replay; issue the collective outside the capture "
              "(the group stays usable).");
}

c10::intrusive_ptr<c10d::Work> DeviceCollectives::staged(c10d::OpType type, const char* coll,
                                                         std::vector<at::Tensor> outputs,
                                                         const Plan& plan, Lane lane,
                                                         bool syncOnWait, int peer) {
  checkNotCapturing(coll);
  checkUsable(coll);
  auto entered = ctx_->enter();
  DeviceStage stage(*ctx_, *pool_, coll);
  HostCall call = plan(stage);
  {
    // The CPU path's own argument checks, on the caller's thread.
    ProcessGroupSmddp::CheckOnly check;
    (void)call(group_);
  }
  auto work = c10::make_intrusive<DeviceWork>(ctx_, rank_, type, coll, std::move(outputs),
                                              timeout_, syncOnWait);
  stage.chunk_.host = [host = host_, watch = watch_, call, work](void*) {
    if (auto w = call(formedHost(*host, *watch))) {
      w->wait();
      work->setSourceRank(w->sourceRank());
    }
  };
  smddp::StagingCall sc;
  sc.what = coll;
  sc.chunks.push_back(std::move(stage.chunk_));
  smddp::StagingPipeline& pipe = lane == Lane::kCollective ? *pipeline_ : p2pLane(lane, peer);
  auto launched = launch(pipe, work, std::move(stage.read_), std::move(stage.written_),
                         std::move(stage.keep_), std::move(sc));
  if (lane != Lane::kCollective) {
    std::lock_guard<std::mutex> lock(p2pMu_);
    std::erase_if(p2pPending_, [](const auto& w) { return w->hostEnded(); });
    p2pPending_.push_back(work);
  }
  return launched;
}

c10::intrusive_ptr<c10d::Work> DeviceCollectives::behindP2P(c10::intrusive_ptr<c10d::Work> barrier) {
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  {
    std::lock_guard<std::mutex> lock(p2pMu_);
    for (const auto& w : p2pPending_) works.push_back(w);
  }
  if (works.empty()) return barrier;
  works.push_back(barrier);  // last: the gathered Work takes its sequence number
  auto entered = ctx_->enter();  // the Work's future is made on the device
  return gatheredDeviceWork(ctx_, rank_, works, timeout_, c10d::OpType::BARRIER, "barrier", {},
                            /*syncOnWait=*/true);
}

c10::intrusive_ptr<c10d::Work> DeviceCollectives::launch(smddp::StagingPipeline& pipe,
                                                         c10::intrusive_ptr<DeviceWork> work,
                                                         std::vector<at::Tensor> read,
                                                         std::vector<at::Tensor> written,
                                                         std::vector<at::Tensor> keep,
                                                         smddp::StagingCall call) {
  work->setSequence(calls_.fetch_add(1));
  // Inside the caller's enter(): the readiness event goes on its stream.
  call.ready = ctx_->callerReady();
  // Only the streams that touch a tensor record it; the call also holds
  // every tensor until its last copy has run (the reaper releases `keep`).
  for (const auto& t : read) ctx_->protect(t, pipe.inStream());
  for (const auto& t : written) ctx_->protect(t, pipe.outStream());
  call.keep = std::make_shared<std::vector<at::Tensor>>(std::move(keep));
  call.done = [work](std::exception_ptr e, smddp::DeviceEventPtr done) {
    work->hostFinished(e, done ? std::vector<smddp::DeviceEventPtr>{done}
                               : std::vector<smddp::DeviceEventPtr>{});
  };
  try {
    pipe.submit(std::move(call));
  } catch (const smddp::Error& e) {
    rethrowAsTorch(e);
  }
  return work;
}

}  // namespace c10d_smddp
