#include "device/cuda/nccl_intra.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>

#include "common/error.h"
#include "device/cuda/cuda_device.h"
#include "device/nccl_host.h"

namespace smddp {

namespace {

NcclResult fromNccl(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return NcclResult::kSuccess;
    case ncclUnhandledCudaError: return NcclResult::kUnhandledCudaError;
    case ncclSystemError: return NcclResult::kSystemError;
    case ncclInternalError: return NcclResult::kInternalError;
    case ncclInvalidArgument: return NcclResult::kInvalidArgument;
    case ncclInvalidUsage: return NcclResult::kInvalidUsage;
    case ncclRemoteError: return NcclResult::kRemoteError;
    case ncclInProgress: return NcclResult::kInProgress;
    default: return NcclResult::kInternalError;
  }
}

ncclResult_t toNccl(NcclResult r) {
  switch (r) {
    case NcclResult::kSuccess: return ncclSuccess;
    case NcclResult::kUnhandledCudaError: return ncclUnhandledCudaError;
    case NcclResult::kSystemError: return ncclSystemError;
    case NcclResult::kInternalError: return ncclInternalError;
    case NcclResult::kInvalidArgument: return ncclInvalidArgument;
    case NcclResult::kInvalidUsage: return ncclInvalidUsage;
    case NcclResult::kRemoteError: return ncclRemoteError;
    case NcclResult::kInProgress: return ncclInProgress;
  }
  return ncclInternalError;
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

ncclComm_t native(NcclComm comm) { return reinterpret_cast<ncclComm_t>(comm); }

class CudaNccl final : public NcclApi {
 public:
  std::string uniqueId() override {
    ncclUniqueId id;
    const ncclResult_t r = ncclGetUniqueId(&id);
    SMDDP_CHECK(r == ncclSuccess, kInternal,
                std::string("smddp: intra-host NCCL: ncclGetUniqueId failed: ") + ncclGetErrorString(r));
    return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
  }
  NcclResult commInitRankNonBlocking(NcclComm* comm, int nranks, const std::string& id,
                                     int rank) override {
    SMDDP_CHECK(id.size() == sizeof(ncclUniqueId), kInvalidArgument,
                "smddp: intra-host NCCL: a unique id of " + std::to_string(id.size()) +
                    " bytes (NCCL's has " + std::to_string(sizeof(ncclUniqueId)) + ")");
    ncclUniqueId uid;
    std::memcpy(&uid, id.data(), sizeof(uid));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // so a host whose peer never comes can give up
    ncclComm_t c = nullptr;
    const ncclResult_t r = ncclCommInitRankConfig(&c, nranks, uid, rank, &config);
    *comm = reinterpret_cast<NcclComm>(c);
    return fromNccl(r);
  }
  NcclResult reduceScatter(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                           NcclComm comm, DeviceStream& stream) override {
    return fromNccl(ncclReduceScatter(send, recv, count, ncclType(dtype), ncclOp(op), native(comm),
                                      CudaDevice::native(stream)));
  }
  NcclResult allGather(const void* send, void* recv, size_t count, DataType dtype, NcclComm comm,
                       DeviceStream& stream) override {
    return fromNccl(
        ncclAllGather(send, recv, count, ncclType(dtype), native(comm), CudaDevice::native(stream)));
  }
  NcclResult commGetAsyncError(NcclComm comm, NcclResult* state) override {
    ncclResult_t s = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(native(comm), &s);
    *state = fromNccl(s);
    return fromNccl(r);
  }
  NcclResult commAbort(NcclComm comm) override { return fromNccl(ncclCommAbort(native(comm))); }
  NcclResult commDestroy(NcclComm comm) override { return fromNccl(ncclCommDestroy(native(comm))); }
  std::string errorString(NcclResult r) override { return ncclGetErrorString(toNccl(r)); }
  std::string lastError(NcclComm comm) override {
    const char* m = ncclGetLastError(native(comm));
    return m ? m : "";
  }
};

}  // namespace

std::shared_ptr<NcclApi> cudaNccl() {
  static const std::shared_ptr<NcclApi> api = std::make_shared<CudaNccl>();  // stateless
  return api;
}

std::unique_ptr<IntraHost> newNcclIntraHost(int device, int rank, int size, const std::string& id,
                                             std::chrono::milliseconds timeout) {
  return newNcclIntraHost(cudaNccl(), "GPU " + std::to_string(device), rank, size, id, timeout);
}

std::string ncclVersionString() {
  int v = 0;
  const ncclResult_t r = ncclGetVersion(&v);
  SMDDP_CHECK(r == ncclSuccess, kInternal,
              std::string("smddp: ncclGetVersion failed: ") + ncclGetErrorString(r));
  // NCCL_VERSION(X,Y,Z) = X*10000 + Y*100 + Z since 2.9.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

}  // namespace smddp
