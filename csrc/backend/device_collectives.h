// Collectives on device (CUDA) tensors: the same engine behind a staging
// pipeline (device/staging_pipeline.h). A call records an event on the
// caller's stream, queues its copies to page-locked host memory, and
// returns a DeviceWork at once. The pipeline thread then runs the call's
// CPU collective on the host copies, on a private host-only group (so the
// order of host collectives is the device calls' order on every rank), and
// the copies back are released by the pipeline's host flag.
//
// Allreduce is cut into chunks of one staging slot each, so the copy in of
// one chunk, the CPU reduction of the one before and the copy back of an
// earlier one overlap. Each chunk is an allreduce of its own; allreduce is
// elementwise, so the result is bitwise the CPU path's on the same inputs.
// Every other collective is staged whole: its inputs in, the CPU
// collective, its outputs back.
//
// Arguments are checked on the caller's thread, with the CPU path's own
// checks and messages: the host call is run once in check-only mode
// (ProcessGroupSmddp::CheckOnly) before anything is queued.
#pragma once

#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/device_context.h"
#include "device/staging_pipeline.h"

namespace c10d_smddp {

class ProcessGroupSmddp;

// The Work of a device call. wait() makes the caller's stream wait for the
// copies back (it does not block the host on CUDA); the future completes
// once the host part is done, with events after the copies back.
class DeviceWork : public c10d::Work {
 public:
  DeviceWork(DeviceContext& ctx, int rank, c10d::OpType type, const char* coll,
             std::vector<at::Tensor> outputs, std::chrono::milliseconds timeout);
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }

  // The pipeline's event after the call's last copy back.
  void attach(smddp::DeviceEventPtr completion);
  // The host part finished (pipeline thread): null, or the failure.
  void hostFinished(std::exception_ptr error);

 private:
  void completeLocked();  // both halves known: completes the future (on the pool)

  DeviceContext& ctx_;
  std::string title_;  // "smddp:all_gather"
  std::vector<at::Tensor> outputs_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  smddp::DeviceEventPtr completion_;  // guarded by mu_
  bool hostDone_ = false;             // guarded by mu_
  std::exception_ptr error_;          // guarded by mu_
};

// The host counterparts of one whole-staged call's device tensors.
class DeviceStage {
 public:
  explicit DeviceStage(DeviceContext& ctx, const char* coll) : ctx_(ctx), coll_(coll) {}
  // A page-locked host tensor shaped like `t` (contiguous, on this stage's
  // device); `read`: copied in before the host call, `write`: copied back.
  at::Tensor map(const at::Tensor& t, bool read, bool write);
  std::vector<at::Tensor> map(const std::vector<at::Tensor>& ts, bool read, bool write);
  std::vector<std::vector<at::Tensor>> map(const std::vector<std::vector<at::Tensor>>& ts,
                                           bool read, bool write);

 private:
  friend class DeviceCollectives;
  DeviceContext& ctx_;
  const char* coll_;
  smddp::StagingChunk chunk_;
  std::vector<at::Tensor> keep_;
};

class DeviceCollectives {
 public:
  // A host call runs the collective on the host group and returns its Work.
  using HostCall = std::function<c10::intrusive_ptr<c10d::Work>(ProcessGroupSmddp&)>;
  // What a collective gives viaDevice: it maps its tensors on the stage and
  // returns the host call over the mapped ones.
  using Plan = std::function<HostCall(DeviceStage&)>;

  DeviceCollectives(std::unique_ptr<DeviceContext> ctx, c10::intrusive_ptr<ProcessGroupSmddp> host,
                    int rank, std::chrono::milliseconds timeout);
  ~DeviceCollectives();

  c10::Device device() const { return ctx_->torchDevice(); }
  enum class Lane { kCollective, kSend, kRecv };
  // A call staged whole; `outputs` are what Work::result() returns. Sends
  // and receives take lanes (pipelines) of their own.
  c10::intrusive_ptr<c10d::Work> staged(c10d::OpType type, const char* coll,
                                        std::vector<at::Tensor> outputs, const Plan& plan,
                                        Lane lane = Lane::kCollective);
  // allreduce and allreduce_coalesced: chunked through the staging slots.
  c10::intrusive_ptr<c10d::Work> allreduce(c10d::OpType type, const char* coll,
                                           std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts);
  // Stops the host group, then the pipeline; bounded (see StagingPipeline).
  void shutdown();

 private:
  c10::intrusive_ptr<c10d::Work> launch(smddp::StagingPipeline& pipe, c10d::OpType type,
                                        const char* coll,
                                        std::vector<at::Tensor> outputs,
                                        std::vector<at::Tensor> keep, smddp::StagingCall call);
  void checkUsable(const char* coll) const;

  std::unique_ptr<DeviceContext> ctx_;
  c10::intrusive_ptr<ProcessGroupSmddp> host_;
  int rank_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<smddp::StagingPipeline> pipeline_, sendPipe_, recvPipe_;
  std::mutex inFlightMu_;
  // Each call's tensors until its completion event.
  std::vector<std::pair<smddp::DeviceEventPtr, std::vector<at::Tensor>>> inFlight_;
};

}  // namespace c10d_smddp
