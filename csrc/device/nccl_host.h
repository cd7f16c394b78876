// IntraHost (intra_host.h) over NCCL's API (nccl_api.h): one communicator
// over the GPUs of one host, made from a unique id the torch side passes
// through the c10d Store. Init is non-blocking and bounded by the timeout;
// a failure or a timeout aborts the communicator (ncclCommAbort). The same
// code runs on NCCL (cuda/nccl_intra.cc) and on the simulated NCCL
// (sim_nccl.h), which is how CI tests it. docs/design.md, "NCCL inside the
// host".
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "device/intra_host.h"
#include "device/nccl_api.h"

namespace smddp {

// Forms the communicator of `rank` of `size` from `id` (NcclApi::uniqueId
// on local rank 0). `where` names the device in messages ("GPU 3").
// Throws kTimeout when it does not form within `timeout`.
std::unique_ptr<IntraHost> newNcclIntraHost(std::shared_ptr<NcclApi> api, std::string where,
                                             int rank, int size, const std::string& id,
                                             std::chrono::milliseconds timeout);

}  // namespace smddp
