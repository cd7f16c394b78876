#include "device/cuda/nccl_intra.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <mutex>
#include <thread>

#include "common/error.h"
#include "device/cuda/cuda_device.h"

namespace smddp {

namespace {

void check(ncclResult_t r, const char* call) {
  if (r == ncclSuccess || r == ncclInProgress) return;
  throwError(ErrorKind::kInternal,
             std::string("smddp: intra-host NCCL: ") + call + " failed: " + ncclGetErrorString(r));
}

ncclDataType_t ncclType(DataType t) {
  switch (t) {
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat64: return ncclFloat64;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kBFloat16: return ncclBfloat16;
    case DataType::kInt8: return ncclInt8;
    case DataType::kUInt8: return ncclUint8;
    case DataType::kInt32: return ncclInt32;
    case DataType::kInt64: return ncclInt64;
    default: break;
  }
  throwError(ErrorKind::kInvalidArgument,
             std::string("smddp: intra-host NCCL has no type for ") + toString(t));
}

ncclRedOp_t ncclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kProduct: return ncclProd;
    default: break;
  }
  throwError(ErrorKind::kInvalidArgument,
             std::string("smddp: intra-host NCCL has no reduction ") + toString(op));
}

class NcclIntraHost final : public IntraHost {
 public:
  NcclIntraHost(int device, int rank, int size, const std::string& id,
                std::chrono::milliseconds timeout)
      : rank_(rank), size_(size) {
    SMDDP_CHECK(id.size() == sizeof(ncclUniqueId), kInvalidArgument,
                "smddp: intra-host NCCL: a unique id of " + std::to_string(id.size()) +
                    " bytes (NCCL's has " + std::to_string(sizeof(ncclUniqueId)) + ")");
    ncclUniqueId uid;
    std::memcpy(&uid, id.data(), sizeof(uid));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // so a host whose peer never comes can give up
    check(ncclCommInitRankConfig(&comm_, size, uid, rank, &config), "ncclCommInitRankConfig");
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      check(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
      if (state == ncclSuccess) break;
      if (state != ncclInProgress || std::chrono::steady_clock::now() > deadline) {
        abort();
        throwError(state == ncclInProgress ? ErrorKind::kTimeout : ErrorKind::kInternal,
                   "smddp: the intra-host NCCL communicator of GPU " + std::to_string(device) +
                       " (local rank " + std::to_string(rank) + " of " + std::to_string(size) +
                       ") did not form within " + std::to_string(timeout.count()) + " ms" +
                       (state == ncclInProgress ? "" : std::string(": ") + ncclGetErrorString(state)));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  ~NcclIntraHost() override {
    std::lock_guard<std::mutex> lk(mu_);
    if (comm_) (void)ncclCommDestroy(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void reduceScatter(DeviceStream& stream, const void* send, void* recv, size_t count,
                     DataType dtype, ReduceOp op) override {
    std::lock_guard<std::mutex> lk(mu_);
    usable("reduce-scatter");
    check(ncclReduceScatter(send, recv, count, ncclType(dtype), ncclOp(op), comm_,
                            CudaDevice::native(stream)),
          "ncclReduceScatter");
  }
  void allGather(DeviceStream& stream, const void* send, void* recv, size_t count,
                 DataType dtype) override {
    std::lock_guard<std::mutex> lk(mu_);
    usable("all-gather");
    check(ncclAllGather(send, recv, count, ncclType(dtype), comm_, CudaDevice::native(stream)),
          "ncclAllGather");
  }
  void checkHealthy() override {
    std::lock_guard<std::mutex> lk(mu_);
    usable("health check");
    ncclResult_t state = ncclSuccess;
    check(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
    check(state, "an intra-host NCCL operation");
  }
  void abort() override {
    std::lock_guard<std::mutex> lk(mu_);
    if (comm_) (void)ncclCommAbort(comm_);
    comm_ = nullptr;
  }

 private:
  void usable(const char* what) const {
    SMDDP_CHECK(comm_, kAborted, std::string("smddp: intra-host NCCL ") + what +
                                     " after the communicator was aborted");
  }

  int rank_, size_;
  std::mutex mu_;
  ncclComm_t comm_ = nullptr;  // guarded by mu_
};

}  // namespace

std::string ncclUniqueIdBytes() {
  ncclUniqueId id;
  check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

std::unique_ptr<IntraHost> newNcclIntraHost(int device, int rank, int size, const std::string& id,
                                             std::chrono::milliseconds timeout) {
  return std::make_unique<NcclIntraHost>(device, rank, size, id, timeout);
}

std::string ncclVersionString() {
  int v = 0;
  check(ncclGetVersion(&v), "ncclGetVersion");
  // NCCL_VERSION(X,Y,Z) = X*10000 + Y*100 + Z since 2.9.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

}  // namespace smddp
