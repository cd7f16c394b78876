// What smddp tells about one of its groups beyond c10d's Backend interface:
// counters and latency, the provider and allreduce path chosen, the peers
// known lost, the flight recorder, the group's error. The pybind module
// (stats(), provider, lost_ranks, ...) and the device path read a group
// through it, so ProcessGroupSmddp's own surface stays c10d's interface.
// It reads the group's members in place: it lives inside its group
// (ProcessGroupSmddp::inspect()) and never outlives it.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/allreduce_path.h"
#include "observe/stats.h"

namespace smddp {
class Communicator;
class FlightRecorder;
}  // namespace smddp

namespace c10d_smddp {

class AsyncError;
class DeviceCollectives;
class HostGroupFormation;
class ProcessGroupSmddp;

class GroupInspector {
 public:
  // What it reads, each a member of the group: the engine (null only while
  // the group is being torn down), the group's error, its device path's
  // private host group (errors there are the group's), the device path and
  // its mutex, and the count of calls that took it.
  struct Sources {
    const std::unique_ptr<smddp::Communicator>& comm;
    const std::shared_ptr<AsyncError>& asyncError;
    const std::shared_ptr<HostGroupFormation>& hostGroup;
    std::mutex& deviceMu;
    const std::unique_ptr<DeviceCollectives>& device;
    const std::atomic<uint64_t>& deviceCalls;
    int rank;
    int size;
  };
  explicit GroupInspector(const Sources& sources) : s_(sources) {}
  GroupInspector(const GroupInspector&) = delete;
  GroupInspector& operator=(const GroupInspector&) = delete;

  smddp::Stats stats() const;
  // Per (collective, size class) counts and latency percentiles.
  std::vector<smddp::LatencyHistograms::Cell> latencyStats() const;
  // torch_smddp.reset_stats(): every counter back to zero. The counters
  // observe the group; resetting them changes nothing it does.
  void resetStats() const;
  std::string provider() const;
  // How the provider was chosen (SMDDP_FI_PROVIDER, FI_PROVIDER, the layout).
  std::string providerReason() const;
  // "shared-memory" when allreduce runs through the host segment, else the
  // libfabric provider.
  std::string allreducePath() const;
  // The path in words, with its schedule (chunks, fusion, servers, bf16
  // crossing, pairwise rounds): what the set-up log says of it.
  std::string allreduceSchedule() const;
  // How all-gather and reduce-scatter run, in words (stats' gather_scatter_path).
  std::string gatherScatterPath() const;
  int reductionServers() const;
  smddp::Stragglers stragglers() const;
  int standaloneServers() const;
  // The network path's receive ring per peer (SMDDP_RING_DEPTH, resolved).
  int64_t ringDepth() const;
  // The ranks on other hosts this rank keeps liveness connections to.
  std::vector<int> livenessPeers() const;
  std::string storePrefix() const;
  // The device path's private host group: "none" (no device path: no GPU
  // visible), "forming", "formed", "failed" or "shut down"
  // (host_group_formation.h).
  std::string deviceHostGroup() const;
  // Throws (smddp::Error, kPeerLost) when a rank of the group is known to
  // be gone: a same-host peer's owner lock is free, or the liveness monitor
  // lost a peer on another host (PeerTable::checkAlive). Any thread, but
  // never concurrently with shutdown().
  void checkPeersAlive(const std::string& during) const;
  // Ranks known to be gone (PeerTable::lost): a process on this host whose
  // owner lock is free, a rank on another host the liveness monitor lost.
  // What a survivor hands dist.shrink_group. Same rules as checkPeersAlive.
  std::vector<int> lostRanks() const;
  // The group's flight recorder; null with SMDDP_TRACE_BUFFER_SIZE=0.
  std::shared_ptr<const smddp::FlightRecorder> flightRecorder() const;
  // Calls that took the device path (device_collectives.h).
  uint64_t deviceCalls() const { return s_.deviceCalls.load(std::memory_order_relaxed); }
  // The GPU path's allreduce inside a host: "nccl", "shm", or "" before
  // the first device allreduce (intra.h).
  std::string intraRoute() const;
  // The group's asynchronous error as text (async_error.h), its own or its
  // device path's host group's; nullopt while there is none.
  std::optional<std::string> errorMessage() const;

 private:
  const Sources s_;
};

}  // namespace c10d_smddp
