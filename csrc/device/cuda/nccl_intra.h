// IntraHost (device/intra_host.h) with NCCL: one communicator over the
// GPUs of one host, made from a unique id the torch side passes through
// the c10d Store. Init is non-blocking and bounded by the timeout; a
// failure or a timeout aborts the communicator (ncclCommAbort).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "device/intra_host.h"

namespace smddp {

// A new NCCL unique id, as bytes to publish (local rank 0).
std::string ncclUniqueIdBytes();
std::unique_ptr<IntraHost> newNcclIntraHost(int device, int rank, int size, const std::string& id,
                                             std::chrono::milliseconds timeout);
// "2.30.7"
std::string ncclVersionString();

}  // namespace smddp
