// NCCL's API (device/nccl_api.h) on NCCL itself, and the intra-host
// communicator (device/nccl_host.h) over it: one communicator over the
// GPUs of one host, made from a unique id the torch side passes through
// the c10d Store.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "device/intra_host.h"
#include "device/nccl_api.h"

namespace smddp {

// The process's NCCL.
std::shared_ptr<NcclApi> cudaNccl();
// The communicator of GPU `device` (the calling thread's current device).
std::unique_ptr<IntraHost> newNcclIntraHost(int device, int rank, int size, const std::string& id,
                                             std::chrono::milliseconds timeout);
// "2.30.7"
std::string ncclVersionString();

}  // namespace smddp
