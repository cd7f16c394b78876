// The part of NCCL's API that the intra-host communicator (nccl_host.h)
// uses, as a seam. cuda/nccl_intra.cc forwards each call to NCCL;
// sim_nccl.h simulates them under NCCL's rules on the simulated device, so
// that CI tests the wrapper's handling of ncclInProgress, asynchronous
// errors, hung kernels and abort without a GPU. Codes and semantics are
// NCCL's (nccl.h); nothing here includes it.
#pragma once

#include <cstddef>
#include <string>

#include "common/dtype.h"
#include "device/device.h"

namespace smddp {

// ncclResult_t, in NCCL's order.
enum class NcclResult {
  kSuccess,             // ncclSuccess
  kUnhandledCudaError,  // ncclUnhandledCudaError
  kSystemError,         // ncclSystemError
  kInternalError,       // ncclInternalError
  kInvalidArgument,     // ncclInvalidArgument
  kInvalidUsage,        // ncclInvalidUsage
  kRemoteError,         // ncclRemoteError
  kInProgress,          // ncclInProgress
};
const char* toString(NcclResult r);  // "ncclInProgress"

// An opaque communicator: ncclComm_t, or a simulated one.
struct NcclCommHandle;
using NcclComm = NcclCommHandle*;

class NcclApi {
 public:
  virtual ~NcclApi() = default;
  // ncclGetUniqueId, as bytes to hand to every rank. Throws on failure.
  virtual std::string uniqueId() = 0;
  // ncclCommInitRankConfig with config.blocking = 0, on the calling
  // thread's current device: kInProgress while the communicator forms in
  // the background (poll commGetAsyncError).
  virtual NcclResult commInitRankNonBlocking(NcclComm* comm, int nranks, const std::string& id,
                                             int rank) = 0;
  // ncclReduceScatter and ncclAllGather on `stream`. On a non-blocking
  // communicator either may return kInProgress: the kernel is then not yet
  // queued, and no call may use the communicator until commGetAsyncError
  // stops answering kInProgress. Throws kInvalidArgument for a (dtype, op)
  // NCCL has no name for, before calling it.
  virtual NcclResult reduceScatter(const void* send, void* recv, size_t count, DataType dtype,
                                   ReduceOp op, NcclComm comm, DeviceStream& stream) = 0;
  virtual NcclResult allGather(const void* send, void* recv, size_t count, DataType dtype,
                               NcclComm comm, DeviceStream& stream) = 0;
  // ncclCommGetAsyncError: `state` gets kInProgress while the last call is
  // still being carried out, kSuccess once it is, or the communicator's
  // asynchronous error.
  virtual NcclResult commGetAsyncError(NcclComm comm, NcclResult* state) = 0;
  // ncclCommAbort: ends every operation in flight (hung kernels exit) and
  // frees the communicator. Safe while another thread is inside a call on
  // it, as NCCL's is (ProcessGroupNCCL's watchdog relies on it).
  virtual NcclResult commAbort(NcclComm comm) = 0;
  // ncclCommDestroy: waits for the operations in flight, then frees it.
  virtual NcclResult commDestroy(NcclComm comm) = 0;
  // ncclGetErrorString and ncclGetLastError (the communicator's last
  // message, "" for none).
  virtual std::string errorString(NcclResult r) = 0;
  virtual std::string lastError(NcclComm comm) = 0;
};

}  // namespace smddp
