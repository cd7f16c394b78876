#include "backend/group_inspector.h"

#include "algorithms/algorithms_config.h"
#include "backend/async_error.h"
#include "backend/device_collectives.h"
#include "backend/host_group_formation.h"
#include "backend/process_group.h"
#include "engine/communicator.h"

namespace c10d_smddp {

smddp::Stats GroupInspector::stats() const {
  return s_.comm ? s_.comm->stats() : smddp::Stats{};
}

std::vector<smddp::LatencyHistograms::Cell> GroupInspector::latencyStats() const {
  return s_.comm ? s_.comm->latencyStats()
                 : std::vector<smddp::LatencyHistograms::Cell>{};
}

void GroupInspector::resetStats() const {
  if (s_.comm) s_.comm->resetStats();
}

std::string GroupInspector::provider() const { return s_.comm ? s_.comm->provider() : ""; }

std::string GroupInspector::providerReason() const {
  return s_.comm ? s_.comm->providerReason() : "";
}

std::string GroupInspector::allreducePath() const {
  return s_.comm && s_.comm->allreducePath().throughHostSegment() ? "shared-memory" : provider();
}

std::string GroupInspector::allreduceSchedule() const {
  return s_.comm ? s_.comm->pathWords().allreduce : "";
}

std::string GroupInspector::gatherScatterPath() const {
  return s_.comm ? s_.comm->pathWords().gatherScatter : "";
}

int GroupInspector::reductionServers() const {
  return s_.comm ? s_.comm->allreducePath().reductionServers() : 0;
}

smddp::Stragglers GroupInspector::stragglers() const {
  return s_.comm ? s_.comm->allreducePath().stragglers() : smddp::Stragglers{};
}

int GroupInspector::standaloneServers() const {
  return s_.comm ? s_.comm->allreducePath().standaloneServers() : 0;
}

int64_t GroupInspector::ringDepth() const {
  return s_.comm ? smddp::ringDepthFor(s_.comm->config(), s_.comm->peers().oneHost()) : 0;
}

std::vector<int> GroupInspector::livenessPeers() const {
  const smddp::PeerMonitor* monitor = s_.comm ? s_.comm->peers().monitor() : nullptr;
  return monitor ? monitor->watchedRanks() : std::vector<int>{};
}

std::string GroupInspector::storePrefix() const { return s_.comm ? s_.comm->storePrefix() : ""; }

void GroupInspector::checkPeersAlive(const std::string& during) const {
  if (s_.comm) s_.comm->peers().checkAlive(during);
}

std::vector<int> GroupInspector::lostRanks() const {
  std::vector<int> out;
  if (!s_.comm) return out;
  const smddp::PeerTable& peers = s_.comm->peers();
  for (int p = 0; p < s_.size; ++p) {
    if (p != s_.rank && peers.lost(p)) out.push_back(p);
  }
  return out;
}

std::shared_ptr<const smddp::FlightRecorder> GroupInspector::flightRecorder() const {
  return s_.comm ? s_.comm->flightRecorder() : nullptr;
}

std::string GroupInspector::intraRoute() const {
  std::lock_guard<std::mutex> lock(s_.deviceMu);
  return s_.device ? s_.device->intraRoute() : "";
}

std::string GroupInspector::deviceHostGroup() const {
  return s_.hostGroup ? s_.hostGroup->state() : "none";
}

std::optional<std::string> GroupInspector::errorMessage() const {
  if (auto m = s_.asyncError->message()) return m;
  if (auto f = s_.hostGroup ? s_.hostGroup->failure() : std::nullopt) return f;
  auto host = s_.hostGroup ? s_.hostGroup->formed() : nullptr;
  return host ? host->inspect().errorMessage() : std::nullopt;
}

}  // namespace c10d_smddp
