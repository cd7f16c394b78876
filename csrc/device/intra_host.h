// The collectives inside one host that the GPU path's allreduce uses when a
// host has several GPUs (SMDDP_INTRA=nccl): a reduce-scatter over the
// host's GPUs, so that only each GPU's 1/G shard goes through the host and
// across hosts, and an all-gather of the reduced shards. Queued on a device
// stream like any kernel; every rank of the host issues them in the same
// order. nccl_host.h implements them over NCCL's API (nccl_api.h): NCCL
// itself over NVLink (cuda/nccl_intra.cc), or on the stand-in the
// simulated NCCL (sim_nccl.h), whose kernels run on the simulated device.
#pragma once

#include <cstddef>

#include "common/dtype.h"
#include "device/device.h"

namespace smddp {

class IntraHost {
 public:
  virtual ~IntraHost() = default;
  virtual int rank() const = 0;  // this GPU's index among the host's
  virtual int size() const = 0;  // the host's GPUs
  // `recv` (count elements) gets this rank's share of `send` (size() x
  // count elements) reduced over the host.
  virtual void reduceScatter(DeviceStream& stream, const void* send, void* recv, size_t count,
                             DataType dtype, ReduceOp op) = 0;
  // `recv` (size() x count elements) gets every rank's `send` in rank order.
  virtual void allGather(DeviceStream& stream, const void* send, void* recv, size_t count,
                         DataType dtype) = 0;
  // Throws the communicator's asynchronous error, if any (a peer died, a
  // kernel failed).
  virtual void checkHealthy() = 0;
  // Ends every operation in flight (ncclCommAbort); idempotent.
  virtual void abort() = 0;
};

// Whether the intra-host collectives take (dtype, op): the ones NCCL
// reduces natively.
bool intraHostSupports(DataType dtype, ReduceOp op);

}  // namespace smddp
