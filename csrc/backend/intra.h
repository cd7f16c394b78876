// NCCL inside the host (SMDDP_INTRA): with G GPUs on every host, the GPU
// path's allreduce reduce-scatters each chunk over the host's GPUs, sends
// only this GPU's 1/G shard through the host and across hosts (to the
// ranks with the same local index: the rail group), and all-gathers the
// reduced shards. docs/gpu.md, "NCCL inside the host".
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/device_context.h"
#include "device/intra_host.h"
#include "device/nccl_api.h"
#include "engine/communicator.h"

namespace c10d_smddp {

class ProcessGroupSmddp;

// What the GPU path's allreduce takes across hosts when the host is split
// over its GPUs.
struct IntraRoute {
  std::unique_ptr<smddp::IntraHost> host;        // the host's GPUs (NCCL, or the stand-in's)
  c10::intrusive_ptr<ProcessGroupSmddp> rail;    // one rank per host: this GPU's peers
  std::vector<at::Tensor> scratch;               // per staging slot: the shard, on the device
  // The communicator's own stream: its kernels wait for the host's other
  // GPUs, so on the shared pool streams two groups' kernels could queue in
  // a different order on each GPU and deadlock (issue 53, defect 3).
  std::shared_ptr<smddp::DeviceStream> stream;
  int hosts = 1;
  std::string why;                               // for stats and logs: why this route
};

// What a group knows when its first device allreduce comes.
struct IntraSetup {
  c10::intrusive_ptr<c10d::Store> store;
  int rank = 0;
  int size = 1;
  std::vector<std::vector<int>> ranksByHost;
  std::string groupName;
  // The group instance's store prefix ("smddp/<nonce>/", Communicator::
  // storePrefix): every key of the route lives under it.
  std::string instance;
  std::chrono::milliseconds timeout{300000};
  bool sim = false;
  std::optional<smddp::RegisteredServers> servers;  // the rail group's (cross-host) servers
  std::string crossHostDtype;                       // the rail group's cross_host_dtype
  // Throws when a rank of the group is known lost (the group's liveness).
  // Run every few ms while the route's set-up waits for the other ranks
  // through the store, so that a rank lost before its first device
  // allreduce fails the others' at once, naming it, not at the timeout.
  std::function<void()> alive;
};

// SMDDP_INTRA: auto (the host route until the NCCL route has passed the
// multi-GPU checks on hardware; then NCCL where every host has 2 or more
// distinct GPUs), nccl (an error where it cannot be), shm (never). Throws a ValueError
// naming the variable for any other value.
std::string intraMode();

// Decides the route, collectively: every rank of the group calls it, at
// its first device allreduce. Null where the allreduce stays on the host
// path (shm, one GPU per host, GPUs shared); `why` says why either way.
std::shared_ptr<IntraRoute> makeIntraRoute(const IntraSetup& setup, DeviceContext& ctx,
                                           size_t slotBytes, int slots, std::string* why);

// The NCCL the intra-host communicator (device/nccl_host.h) drives:
// the stand-in's simulated one (sim_intra.cc), whose ranks meet through a
// CPU group formed over `store` under the communicator's unique id; or
// NCCL itself (cuda_context.cc; an error in a build without CUDA).
std::shared_ptr<smddp::NcclApi> makeSimNcclApi(const c10::intrusive_ptr<c10d::Store>& store,
                                               const std::string& groupName,
                                               std::chrono::milliseconds timeout, uint64_t seed);
std::shared_ptr<smddp::NcclApi> cudaNcclApi();

}  // namespace c10d_smddp
