#include "device/nccl_host.h"

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

class NcclIntraHost final : public IntraHost {
 public:
  NcclIntraHost(std::shared_ptr<NcclApi> api, std::string where, int rank, int size,
                const std::string& id, std::chrono::milliseconds timeout)
      : api_(std::move(api)), where_(std::move(where)), rank_(rank), size_(size) {
    check(api_->commInitRankNonBlocking(&comm_, size, id, rank), "ncclCommInitRankConfig");
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      NcclResult state = NcclResult::kSuccess;
      check(api_->commGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
      if (state == NcclResult::kSuccess) break;
      if (state != NcclResult::kInProgress || std::chrono::steady_clock::now() > deadline) {
        const bool late = state == NcclResult::kInProgress;
        const std::string why = late ? "" : ": " + api_->errorString(state);
        abort();
        throwError(late ? ErrorKind::kTimeout : ErrorKind::kInternal,
                   "smddp: the intra-host NCCL communicator of " + where_ + " (local rank " +
                       std::to_string(rank) + " of " + std::to_string(size) +
                       ") did not form within " + std::to_string(timeout.count()) + " ms" + why);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  ~NcclIntraHost() override {
    std::lock_guard<std::mutex> lk(mu_);
    if (comm_) (void)api_->commDestroy(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void reduceScatter(DeviceStream& stream, const void* send, void* recv, size_t count,
                     DataType dtype, ReduceOp op) override {
    std::lock_guard<std::mutex> lk(mu_);
    usable("reduce-scatter");
    check(api_->reduceScatter(send, recv, count, dtype, op, comm_, stream), "ncclReduceScatter");
  }
  void allGather(DeviceStream& stream, const void* send, void* recv, size_t count,
                 DataType dtype) override {
    std::lock_guard<std::mutex> lk(mu_);
    usable("all-gather");
    check(api_->allGather(send, recv, count, dtype, comm_, stream), "ncclAllGather");
  }
  void checkHealthy() override {
    std::lock_guard<std::mutex> lk(mu_);
    usable("health check");
    NcclResult state = NcclResult::kSuccess;
    check(api_->commGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
    check(state, "an intra-host NCCL operation");
  }
  void abort() override {
    std::lock_guard<std::mutex> lk(mu_);
    if (comm_) (void)api_->commAbort(comm_);
    comm_ = nullptr;
  }

 private:
  void check(NcclResult r, const char* call) {
    if (r == NcclResult::kSuccess || r == NcclResult::kInProgress) return;
    throwError(ErrorKind::kInternal,
               std::string("smddp: intra-host NCCL: ") + call + " failed: " + api_->errorString(r));
  }
  void usable(const char* what) const {
    SMDDP_CHECK(comm_, kAborted, std::string("smddp: intra-host NCCL ") + what +
                                     " after the communicator was aborted");
  }

  std::shared_ptr<NcclApi> api_;
  std::string where_;
  int rank_, size_;
  std::mutex mu_;
  NcclComm comm_ = nullptr;  // guarded by mu_
};

}  // namespace

std::unique_ptr<IntraHost> newNcclIntraHost(std::shared_ptr<NcclApi> api, std::string where,
                                             int rank, int size, const std::string& id,
                                             std::chrono::milliseconds timeout) {
  return std::make_unique<NcclIntraHost>(std::move(api), std::move(where), rank, size, id,
                                         timeout);
}

}  // namespace smddp
