// The Work a collective returns at once. The engine's worker thread
// completes it: the future is marked with the output tensors (DDP's reducer
// reads results through getFuture()) or set to the error. A future someone
// took is marked on the completion pool, so its callbacks never run on the
// engine thread.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <vector>

namespace c10d_smddp {

// Engine errors become c10d's DistBackendError (Python:
// torch.distributed.DistBackendError, a RuntimeError), message intact;
// torch errors pass through.
std::exception_ptr toTorchError(std::exception_ptr e);

class WorkSmddp : public c10d::Work {
 public:
  WorkSmddp(int rank, c10d::OpType opType, const char* profilingTitle,
            std::vector<at::Tensor> outputs, const std::vector<at::Tensor>& inputs);

  // Once taken, the future is completed on the completion pool, never on
  // the engine thread: its callbacks are user code that may wait for
  // another collective (common/completion_pool.h).
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  // Polls (yielding) for up to SMDDP_SPIN_US before it blocks: most small
  // collectives finish within that, and a wake-up costs more than the poll.
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  // The poll budget of Works created from now on (the group's SMDDP_SPIN_US).
  static void setDefaultSpin(std::chrono::microseconds spin);
  std::vector<at::Tensor> result() override { return outputs_; }
  uint64_t getSequencenumber() const override { return seq_; }
  int sourceRank() const override { return sourceRank_; }
  void setSourceRank(int r) { sourceRank_ = r; }

  void setSequence(uint64_t seq) { seq_ = seq; }
  // Runs after a successful collective, before the future completes: copies
  // results out of staging buffers into non-contiguous user tensors.
  void setFinisher(std::function<void()> f) { finisher_ = std::move(f); }
  // Called once, from the engine's worker thread.
  void complete(std::exception_ptr error);

 private:
  std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> inputsKeptAlive_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::function<void()> finisher_;
  uint64_t seq_ = 0;
  int sourceRank_ = -1;
  std::chrono::microseconds spin_{0};
  std::atomic<bool> engineDone_{false};  // set last by complete()
  // The future's owner: kUntaken until getFuture() (callbacks impossible,
  // so complete() marks it inline), kTaken after (marked on the pool), or
  // kInline/kMarked while and after complete() marks an untaken one.
  enum FutureState : int { kUntaken, kTaken, kInline, kMarked };
  std::atomic<int> futureState_{kUntaken};
  void completeFuture(std::exception_ptr error);
};

}  // namespace c10d_smddp
