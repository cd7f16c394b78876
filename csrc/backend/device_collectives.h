// Collectives on device (CUDA) tensors: the same engine behind a staging
// pipeline (device/staging_pipeline.h). A call records an event on the
// caller's current stream and returns a DeviceWork at once. The pipeline
// thread copies its inputs to page-locked host memory once that event has
// completed, runs the CPU collective on the host copies over a private
// host-only group (so every rank issues host collectives in its device
// calls' order; formed in the background with the group, host_group_formation.h),
// and only then queues the copies back.
//
// Completion (Gloo's CUDA model; docs/design.md, "GPU path"):
// - a call never blocks at submit;
// - work.wait() blocks the host until the call's host part has ended,
//   raises if it failed, and then makes the caller's current stream wait
//   for the copies back;
// - the future completes when the host part has ended, with device events
//   after the copies back;
// - no device queue ever waits for the host.
//
// allreduce, all_gather_into_tensor and reduce_scatter_tensor are cut into
// chunks of one staging slot each, so the copy in of one chunk, the host
// collective of the one before and the copy back of an earlier one overlap.
// Every other collective is staged whole.
//
// Arguments are checked on the caller's thread, with the CPU path's own
// checks and messages: the host call is run once in check-only mode
// (ProcessGroupSmddp::CheckOnly), on the group itself, before anything is
// queued.
#pragma once

#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/device_context.h"
#include "backend/intra.h"
#include "backend/host_group_formation.h"
#include "device/host_pool.h"
#include "device/staging_pipeline.h"

namespace c10d_smddp {

class ProcessGroupSmddp;

// The Work of a device call, or of a coalescing block of them.
class DeviceWork : public c10d::Work {
 public:
  using Listener = std::function<void(std::exception_ptr, const std::vector<smddp::DeviceEventPtr>&)>;

  // `syncOnWait`: wait() also blocks the host until the caller's stream has
  // drained (barrier, as NCCL's).
  DeviceWork(std::shared_ptr<DeviceContext> ctx, int rank, c10d::OpType type, const char* coll,
             std::vector<at::Tensor> outputs, std::chrono::milliseconds timeout,
             bool syncOnWait = false);
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  int sourceRank() const override;
  uint64_t getSequencenumber() const override { return seq_; }
  void setSequence(uint64_t seq) { seq_ = seq; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }

  // The host part ended (pipeline thread): null and the events after the
  // copies back, or the failure.
  void hostFinished(std::exception_ptr error, std::vector<smddp::DeviceEventPtr> done);
  void setSourceRank(int rank);
  bool hostEnded() const;
  // Runs `l` once the host part has ended (at once if it has).
  void onHostFinished(Listener l);

 private:
  void completeLocked();  // completes the future (on the completion pool)

  std::shared_ptr<DeviceContext> ctx_;
  std::string title_;
  std::vector<at::Tensor> outputs_;
  std::chrono::milliseconds timeout_;
  bool syncOnWait_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool hostDone_ = false;                   // guarded by mu_
  std::exception_ptr error_;                // guarded by mu_
  std::vector<smddp::DeviceEventPtr> done_;  // guarded by mu_
  std::vector<Listener> listeners_;         // guarded by mu_
  int sourceRank_ = -1;                     // guarded by mu_
  uint64_t seq_ = 0;                        // set before the Work is handed out
};

// One Work over the works of a coalescing block with device calls among
// them: its host part ends when all of theirs have; wait() waits for every
// one's copies back.
c10::intrusive_ptr<c10d::Work> coalescedDeviceWork(
    std::shared_ptr<DeviceContext> ctx, int rank,
    const std::vector<c10::intrusive_ptr<c10d::Work>>& works, std::chrono::milliseconds timeout);
// The same over `works`, with the given type, title, outputs and
// syncOnWait (see DeviceWork).
c10::intrusive_ptr<c10d::Work> gatheredDeviceWork(
    std::shared_ptr<DeviceContext> ctx, int rank,
    const std::vector<c10::intrusive_ptr<c10d::Work>>& works, std::chrono::milliseconds timeout,
    c10d::OpType type, const char* coll, std::vector<at::Tensor> outputs, bool syncOnWait);

// The host counterparts of one whole-staged call's device tensors.
class DeviceStage {
 public:
  DeviceStage(DeviceContext& ctx, smddp::HostBufferPool& pool, const char* coll)
      : ctx_(ctx), pool_(pool), coll_(coll) {}
  // A host tensor laid out like `t` (dense, same strides); `read`: copied
  // in before the host call, `write`: copied back after it.
  at::Tensor map(const at::Tensor& t, bool read, bool write);
  std::vector<at::Tensor> map(const std::vector<at::Tensor>& ts, bool read, bool write);
  std::vector<std::vector<at::Tensor>> map(const std::vector<std::vector<at::Tensor>>& ts,
                                           bool read, bool write);
  // PREMUL_SUM's factor tensor, when it is on the device, reaches the host
  // through a copy like any input (never a host read of device memory).
  c10d::ReduceOp mapOp(const c10d::ReduceOp& op);

 private:
  friend class DeviceCollectives;
  DeviceContext& ctx_;
  smddp::HostBufferPool& pool_;
  const char* coll_;
  smddp::StagingChunk chunk_;
  std::vector<at::Tensor> read_, written_;  // device tensors, for recordStream
  std::vector<at::Tensor> keep_;
};

class DeviceCollectives {
 public:
  // A host call runs the collective on the host group and returns its Work.
  using HostCall = std::function<c10::intrusive_ptr<c10d::Work>(ProcessGroupSmddp&)>;
  // What a collective gives staged(): it maps its tensors on the stage and
  // returns the host call over the mapped ones.
  using Plan = std::function<HostCall(DeviceStage&)>;

  // `host`: the private host group, which the host calls wait for
  // (host_group_formation.h). `group`: the group this path belongs to, which
  // outlives it: its checks and its liveness.
  DeviceCollectives(std::shared_ptr<DeviceContext> ctx, std::shared_ptr<HostGroupFormation> host,
                    ProcessGroupSmddp& group, int rank, std::chrono::milliseconds timeout,
                    IntraSetup intra);
  ~DeviceCollectives();

  c10::Device device() const { return ctx_->torchDevice(); }
  const std::shared_ptr<DeviceContext>& context() const { return ctx_; }
  enum class Lane { kCollective, kSend, kRecv };
  // A call staged whole; `outputs` are what Work::result() returns. Sends
  // and receives take lanes (pipelines) of their own, one per direction
  // and `peer` (-1: a receive from any source), so a transfer waits only
  // for its own peer and for earlier ones with that peer (NCCL's order).
  // `syncOnWait`: see DeviceWork.
  c10::intrusive_ptr<c10d::Work> staged(c10d::OpType type, const char* coll,
                                        std::vector<at::Tensor> outputs, const Plan& plan,
                                        Lane lane = Lane::kCollective, bool syncOnWait = false,
                                        int peer = -1);
  // allreduce and allreduce_coalesced: chunked through the staging slots.
  c10::intrusive_ptr<c10d::Work> allreduce(c10d::OpType type, const char* coll,
                                           std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts);
  // all_gather_into_tensor and reduce_scatter_tensor of one contiguous
  // pair: chunked (FSDP's path). Null when the pair cannot be chunked
  // (then staged whole).
  c10::intrusive_ptr<c10d::Work> allgatherBase(at::Tensor& output, at::Tensor& input);
  c10::intrusive_ptr<c10d::Work> reduceScatterBase(at::Tensor& output, at::Tensor& input,
                                                   const c10d::ReduceScatterOptions& opts);
  // The list forms (all_gather, reduce_scatter), chunked the same way when
  // the list has one contiguous tensor per rank of the other side's dtype
  // and size; null otherwise (then staged whole, which checks them).
  c10::intrusive_ptr<c10d::Work> allgatherList(std::vector<at::Tensor>& outputs, at::Tensor& input);
  c10::intrusive_ptr<c10d::Work> reduceScatterList(at::Tensor& output,
                                                   std::vector<at::Tensor>& inputs,
                                                   const c10d::ReduceScatterOptions& opts);
  // A barrier's Work that also completes only once this rank's sends and
  // receives issued before it have (their copies back included), as NCCL's
  // barrier orders all of a rank's device work; the barrier itself runs on
  // the collective lane and never waits for them, so a peer may still
  // match them after its own barrier.
  c10::intrusive_ptr<c10d::Work> behindP2P(c10::intrusive_ptr<c10d::Work> barrier);
  // Refuses a call made while the caller's stream captures a graph: the
  // error names the collective, and nothing is queued.
  void checkNotCapturing(const char* coll);
  // Stops the host group, then the pipelines; bounded (see StagingPipeline).
  void shutdown();
  // The route the allreduce takes inside a host ("" before the first
  // allreduce), for stats().
  std::string intraRoute() const;

  // What the collective pipeline's thread consults while it waits, and
  // does when the pipeline breaks (device_collectives.cc).
  class Watch;

 private:
  struct Chunked;
  c10::intrusive_ptr<c10d::Work> launch(smddp::StagingPipeline& pipe, c10::intrusive_ptr<DeviceWork> work,
                                        std::vector<at::Tensor> read, std::vector<at::Tensor> written,
                                        std::vector<at::Tensor> keep, smddp::StagingCall call);
  c10::intrusive_ptr<c10d::Work> launchChunked(c10d::OpType type, const char* coll, Chunked& c);
  // Bytes of one rank's part in each staged piece of an all-gather or
  // reduce-scatter: a slot holds world + 1 of them.
  size_t gatherPiece(size_t elem) const;
  // Whether `parts` are one tensor per rank, each contiguous, on the
  // group's device, of `like`'s dtype and size (and `like` is too).
  bool chunkableParts(const std::vector<at::Tensor>& parts, const at::Tensor& like) const;
  // The chunked all-gather into rank r's part at outs[r], and reduce-scatter
  // from rank r's part at ins[r]; `outputs` and `inputs` are the tensors
  // they lie in (the Work's result, and what the copies keep alive).
  c10::intrusive_ptr<c10d::Work> gatherChunked(c10d::OpType type, const char* coll,
                                               const at::Tensor& input,
                                               const std::vector<uint8_t*>& outs,
                                               const std::vector<at::Tensor>& outputs);
  c10::intrusive_ptr<c10d::Work> scatterChunked(c10d::OpType type, const char* coll,
                                                const std::vector<uint8_t*>& ins,
                                                const std::vector<at::Tensor>& inputs,
                                                const at::Tensor& output,
                                                const c10d::ReduceScatterOptions& opts);
  // The intra-host route, decided at the first allreduce (collective).
  std::shared_ptr<IntraRoute> intraRouteFor();
  // Appends the chunks of `t` through the intra-host route; returns the
  // elements left over (fewer than the host's GPUs) at the tensor's end.
  size_t intraChunks(Chunked& c, const at::Tensor& t, smddp::DataType dt, smddp::ReduceOp op,
                     const c10d::AllreduceOptions& railOpts);
  void checkUsable(const char* coll) const;
  // The lane of sends to (or receives from) `peer`, made at its first use.
  smddp::StagingPipeline& p2pLane(Lane lane, int peer);
  std::vector<smddp::StagingPipeline*> pipelines() const;

  std::shared_ptr<DeviceContext> ctx_;
  std::shared_ptr<HostGroupFormation> host_;
  ProcessGroupSmddp& group_;
  int rank_;
  int world_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<smddp::HostBufferPool> pool_;
  IntraSetup intraSetup_;
  std::once_flag intraOnce_;
  std::shared_ptr<IntraRoute> intra_;  // set once by intraRouteFor()
  mutable std::mutex intraMu_;
  std::string intraWhy_;               // guarded by intraMu_
  std::exception_ptr intraError_;      // guarded by intraMu_: the route's formation failed
  std::atomic<uint64_t> calls_{0};  // device calls issued: their Works' sequence numbers
  std::shared_ptr<Watch> watch_;    // shared with the collective pipeline's thread
  std::unique_ptr<smddp::StagingPipeline> pipeline_;
  smddp::StagingOptions p2pOptions_;
  mutable std::mutex p2pMu_;
  // guarded by p2pMu_: the p2p lanes by (direction, peer); a lane is never
  // removed before shutdown, so a reference to one stays valid.
  std::map<std::pair<Lane, int>, std::unique_ptr<smddp::StagingPipeline>> p2pLanes_;
  // guarded by p2pMu_: sends and receives whose host part may not have
  // ended, for behindP2P (the ended ones are dropped at each new one).
  std::vector<c10::intrusive_ptr<DeviceWork>> p2pPending_;
};

// Waits for `work` as its wait() does, running `watch`'s check every few
// ms meanwhile (the NCCL route's host work, waiting on the rail).
void waitWatched(c10d::Work& work, DeviceCollectives::Watch& watch, const std::string& during);
// The private host group, once formed; meanwhile `watch`'s check runs every
// few ms, so a rank lost before it formed fails the call at once, naming it.
ProcessGroupSmddp& formedHost(HostGroupFormation& host, DeviceCollectives::Watch& watch);

}  // namespace c10d_smddp
