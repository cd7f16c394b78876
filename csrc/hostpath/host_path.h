// Where a group's ranks live, and the set-up of the shared-memory
// allreduce path: one segment per host, opened only when every host holds
// the same number of ranks and every rank could map its host's segment.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine_config.h"
#include "transport/bootstrap.h"

namespace smddp {

class EngineContext;
class FusionBufferScheduler;

// The host path's own tunables (readHostPathParams here and
// readFusionParams, fusion_scheduler.h), carried by the group's
// EngineConfig (common/layer_configs.h).
struct HostPathConfig {
  int64_t streamSpinUs = 0;        // SMDDP_STREAM_SPIN_US: polling inside a batch's data steps
  uint64_t shmSlotBytes = 0;       // SMDDP_SHM_SLOT_BYTES: one pipeline step of one shard (0: auto)
  int64_t shmDepth = 0;            // SMDDP_SHM_DEPTH: pipeline steps in flight (0: auto)
  uint64_t streamingBytes = 0;     // batches this large write results with streaming stores
  uint64_t smallBytes = 0;         // batches up to this size: one step, every rank reduces all
  uint64_t stageBytes = 0;         // SMDDP_STAGE_BYTES: staged at a time by one-host gathers
  uint64_t eagerBytes = 0;         // SMDDP_EAGER_GATHER_BYTES: one-host all-gathers leaving early
  std::string serverJob;           // SMDDP_SERVER_JOB
  int serverSharePercent = -1;     // SMDDP_SERVER_SHARE (-1: balanced)
  int64_t serverWaitSeconds = 60;  // SMDDP_SERVER_WAIT
  bool serverRequired = false;     // SMDDP_SERVER_REQUIRED
};

inline const HostPathConfig& hostPathConfig(const EngineConfig& c) {
  return c.layers.get<HostPathConfig>();
}

// The host path's parameters (host_path.cc): segment geometry, standalone
// reduction servers, SMDDP_CROSS_HOST_DTYPE.
void readHostPathParams(EngineConfig& c);

// Which ranks share a host. Hosts are numbered by their lowest rank.
struct HostTopology {
  int hostIndex = 0;
  int localRank = 0;
  int localSize = 1;
  std::vector<std::vector<int>> ranksOfHost;  // global ranks, ascending
  bool oversubscribed = false;                // this host has more ranks than cores
  static HostTopology of(const std::vector<std::string>& hostOfRank, int rank);
  int hosts() const { return static_cast<int>(ranksOfHost.size()); }
  // Every host has the same number of ranks.
  bool uniform() const;
};

// The segment openHostPath opens on each host for `localSize` ranks per
// host over `hosts` hosts, from the configuration (SMDDP_SHM_SLOT_BYTES,
// SMDDP_SHM_DEPTH, SMDDP_SERVERS_PER_NODE, SMDDP_SHM_ALLREDUCE,
// SMDDP_SERVER_HOSTS) and the host's `cores`: what `python -m
// torch_smddp.info` holds /dev/shm against. `unused` says why a group of
// that layout opens none ("" when it opens one).
struct SegmentGeometry {
  int servers = 0;
  uint64_t slotBytes = 0;
  int depth = 0;
  bool deep = false;   // across hosts or oversubscribed: larger steps, deeper ring
  uint64_t bytes = 0;  // the whole segment, in /dev/shm
  std::string unused;
};
SegmentGeometry hostSegmentGeometry(const EngineConfig& c, int localSize, int hosts,
                                    unsigned cores);
// The cores this process may run on (its affinity mask).
unsigned onlineCores();

// What torch_smddp/__init__.py needs to look the standalone reduction
// servers up in a store (SMDDP_SERVER_COUNT, SMDDP_SERVER_JOB,
// SMDDP_SERVER_RENDEZVOUS; whether SMDDP_SERVER_HOSTS lists any), read and
// checked here, where they are declared, never parsed again in Python.
// Throws kInvalidArgument naming a malformed variable.
struct ServerLookup {
  int64_t count = 0;
  std::string job;
  std::string rendezvous;
  bool hostsGiven = false;
};
ServerLookup serverLookupParams();

// Every rank's `vote` under `key` (through `bootstrap`, bounded by the
// group timeout), gathered with the SMDDP_CROSS_HOST_DTYPE each rank sends
// across hosts, which must be the same on every rank: throws
// kInvalidArgument naming a rank whose differs and both types. Returns the
// votes alone, rank by rank.
std::vector<std::string> gatherVotesSameWire(EngineContext& ctx, Bootstrap& bootstrap,
                                             const std::string& key, const std::string& vote);

// Opens each host's segment (through `bootstrap`, bounded by the group
// timeout) and returns the scheduler that runs allreduce over it, or null
// when the layout or some rank's shared memory does not allow it; every
// rank reaches the same answer. When null, `reason` says why in a few words
// for the group's description ("one rank per host"), and `whyNot` says what
// went wrong, for the one warning the caller gives (empty when the layout
// alone rules the path out). `hostOfRank` and `ownerOfRank` (each rank's
// shm owner tag, transport/shm_owner.h) come from the group's peer exchange.
std::unique_ptr<FusionBufferScheduler> openHostPath(EngineContext& ctx, Bootstrap& bootstrap,
                                                    const std::vector<std::string>& hostOfRank,
                                                    const std::vector<std::string>& ownerOfRank,
                                                    std::string* reason, std::string* whyNot);

}  // namespace smddp
