#include "device/nccl_host.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

#include "common/error.h"

namespace smddp {

const char* toString(NcclResult r) {
  switch (r) {
    case NcclResult::kSuccess: return "ncclSuccess";
    case NcclResult::kUnhandledCudaError: return "ncclUnhandledCudaError";
    case NcclResult::kSystemError: return "ncclSystemError";
    case NcclResult::kInternalError: return "ncclInternalError";
    case NcclResult::kInvalidArgument: return "ncclInvalidArgument";
    case NcclResult::kInvalidUsage: return "ncclInvalidUsage";
    case NcclResult::kRemoteError: return "ncclRemoteError";
    case NcclResult::kInProgress: return "ncclInProgress";
  }
  return "ncclResult(?)";
}

namespace {

// The communicator is non-blocking, so that a host whose peer never comes
// can give up. NCCL's rule for such a communicator: a call that answers
// ncclInProgress has not yet queued its kernel, and no call may use the
// communicator until ncclCommGetAsyncError stops answering ncclInProgress.
// So every call here waits for that (polling, bounded by the timeout)
// before it returns: whatever its caller queues on the stream next runs
// after the kernel, and the next call is never refused. A call still in
// progress at the timeout, or an error, aborts the communicator, as
// ProcessGroupNCCL does.
//
// Two locks: issueMu_ keeps one call at a time on the communicator (NCCL's
// rule) and is held across a launch, which under CUDA_LAUNCH_BLOCKING
// blocks until the kernel has run (for good, with a dead peer); stateMu_
// guards the handle and is held only for a moment, so abort() never waits
// for a launch. ncclCommAbort from another thread is how NCCL ends a hung
// kernel (ProcessGroupNCCL's watchdog does the same); the launch then
// returns, and its call fails with kAborted.
class NcclIntraHost final : public IntraHost {
 public:
  NcclIntraHost(std::shared_ptr<NcclApi> api, std::string where, int rank, int size,
                const std::string& id, std::chrono::milliseconds timeout)
      : api_(std::move(api)), where_(std::move(where)), rank_(rank), size_(size), timeout_(timeout) {
    std::lock_guard<std::mutex> issue(issueMu_);
    NcclComm comm = nullptr;
    const NcclResult r = api_->commInitRankNonBlocking(&comm, size, id, rank);
    {
      std::lock_guard<std::mutex> lk(stateMu_);
      comm_ = comm;
    }
    settle(r, "ncclCommInitRankConfig",
           "the intra-host NCCL communicator of " + where_ + " (local rank " +
               std::to_string(rank) + " of " + std::to_string(size) + ") did not form");
  }
  ~NcclIntraHost() override {
    std::lock_guard<std::mutex> lk(stateMu_);
    if (!comm_) return;
    // A communicator with an error (or hung work) is aborted: NCCL's destroy
    // would wait for its kernels.
    NcclResult state = NcclResult::kSuccess;
    if (api_->commGetAsyncError(comm_, &state) == NcclResult::kSuccess && state == NcclResult::kSuccess) {
      (void)api_->commDestroy(comm_);
    } else {
      (void)api_->commAbort(comm_);
    }
    comm_ = nullptr;
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void reduceScatter(DeviceStream& stream, const void* send, void* recv, size_t count,
                     DataType dtype, ReduceOp op) override {
    std::lock_guard<std::mutex> issue(issueMu_);
    const NcclComm comm = usable("ncclReduceScatter");
    settle(api_->reduceScatter(send, recv, count, dtype, op, comm, stream), "ncclReduceScatter",
           "ncclReduceScatter on " + where_);
  }
  void allGather(DeviceStream& stream, const void* send, void* recv, size_t count,
                 DataType dtype) override {
    std::lock_guard<std::mutex> issue(issueMu_);
    const NcclComm comm = usable("ncclAllGather");
    settle(api_->allGather(send, recv, count, dtype, comm, stream), "ncclAllGather",
           "ncclAllGather on " + where_);
  }
  void checkHealthy() override {
    NcclResult r, state = NcclResult::kSuccess;
    {
      std::lock_guard<std::mutex> lk(stateMu_);
      SMDDP_CHECK(comm_, kAborted, "smddp: intra-host NCCL on " + where_ + ": the communicator was aborted");
      r = api_->commGetAsyncError(comm_, &state);
    }
    if (r != NcclResult::kSuccess) fail("ncclCommGetAsyncError", r);
    if (state != NcclResult::kSuccess && state != NcclResult::kInProgress) {
      fail("an intra-host NCCL operation", state);
    }
  }
  void abort() override {
    std::lock_guard<std::mutex> lk(stateMu_);
    aborted_.store(true);
    if (comm_) (void)api_->commAbort(comm_);
    comm_ = nullptr;
  }

 private:
  // After a call answered `r` (issueMu_ held): returns once its work is
  // queued (kSuccess), else aborts the communicator and throws. `what`
  // opens the timeout's message.
  void settle(NcclResult r, const char* call, const std::string& what) {
    throwIfAborted(call);
    if (r == NcclResult::kSuccess) return;
    if (r != NcclResult::kInProgress) fail(call, r);
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    auto nap = std::chrono::microseconds(20);
    for (;;) {
      NcclResult q, state = NcclResult::kSuccess;
      {
        std::lock_guard<std::mutex> lk(stateMu_);
        if (!comm_) break;  // aborted meanwhile
        q = api_->commGetAsyncError(comm_, &state);
      }
      if (q != NcclResult::kSuccess) fail("ncclCommGetAsyncError", q);
      if (state == NcclResult::kSuccess) break;
      if (state != NcclResult::kInProgress) fail(call, state);
      if (std::chrono::steady_clock::now() > deadline) {
        abort();
        throwError(ErrorKind::kTimeout,
                   "smddp: " + what + ": still ncclInProgress after " +
                       std::to_string(timeout_.count()) +
                       " ms (the group timeout); the communicator was aborted");
      }
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(1000));
    }
    throwIfAborted(call);
  }
  void throwIfAborted(const char* call) const {
    SMDDP_CHECK(!aborted_.load(), kAborted,
                "smddp: intra-host NCCL on " + where_ + ": " + call +
                    " ended by the communicator's abort (shutdown or an earlier failure)");
  }
  // A failed call: the communicator is of no further use (NCCL's rule after
  // an error is to abort it), which also ends its hung kernels.
  [[noreturn]] void fail(const char* call, NcclResult r) {
    std::string detail;
    {
      std::lock_guard<std::mutex> lk(stateMu_);
      if (comm_) detail = api_->lastError(comm_);
    }
    throwIfAborted(call);  // a call refused because it raced the abort
    abort();
    throwError(ErrorKind::kInternal, "smddp: intra-host NCCL on " + where_ + ": " + call +
                                         " failed: " + api_->errorString(r) +
                                         (detail.empty() ? "" : " (" + detail + ")") +
                                         "; the communicator was aborted");
  }
  NcclComm usable(const char* what) {
    std::lock_guard<std::mutex> lk(stateMu_);
    SMDDP_CHECK(comm_, kAborted, "smddp: intra-host NCCL " + std::string(what) + " on " + where_ +
                                     " after the communicator was aborted");
    return comm_;
  }

  std::shared_ptr<NcclApi> api_;
  std::string where_;
  int rank_, size_;
  std::chrono::milliseconds timeout_;
  std::mutex issueMu_;              // one call at a time; held across launches
  std::mutex stateMu_;              // held for a moment, never across a launch
  NcclComm comm_ = nullptr;         // guarded by stateMu_
  std::atomic<bool> aborted_{false};
};

}  // namespace

std::unique_ptr<IntraHost> newNcclIntraHost(std::shared_ptr<NcclApi> api, std::string where,
                                             int rank, int size, const std::string& id,
                                             std::chrono::milliseconds timeout) {
  return std::make_unique<NcclIntraHost>(std::move(api), std::move(where), rank, size, id,
                                         timeout);
}

}  // namespace smddp
