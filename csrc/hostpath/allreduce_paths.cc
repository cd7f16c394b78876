// The choice of a group's allreduce path (allreduce_paths.h), and the
// configuration every layer contributes to.
#include "hostpath/allreduce_paths.h"

#include <algorithm>

#include "algorithms/algorithms.h"
#include "algorithms/algorithms_config.h"
#include "common/error.h"
#include "common/logging.h"
#include "hostpath/fusion_scheduler.h"
#include "hostpath/host_path.h"
#include "algorithms/network_fusion.h"

namespace smddp {

EngineConfig readEngineConfig() {
  EngineConfig c;
  readEngineParams(c);
  readAllreduceParams(c);
  readHostPathParams(c);
  return c;
}

std::unique_ptr<AllreducePath> openAllreducePath(EngineContext& ctx, Bootstrap& bootstrap,
                                                 std::vector<std::string>& shmTrouble) {
  const EngineConfig& config = ctx.config();
  const AlgorithmsConfig& tunables = algorithmsConfig(config);
  // 1. Through each host's shared segment when the layout allows.
  std::string networkOnly = !config.hostPath ? "SMDDP_SHM_ALLREDUCE=0" : "one rank";
  if (config.hostPath && ctx.size() > 1) {
    std::vector<std::string> hosts;
    std::vector<std::string> owners;
    for (const auto& p : ctx.peers().all()) {
      hosts.push_back(p.host);
      owners.push_back(p.owner);
    }
    std::string whyNot;
    auto scheduler = openHostPath(ctx, bootstrap, hosts, owners, &networkOnly, &whyNot);
    if (!whyNot.empty()) shmTrouble.push_back(whyNot);
    if (scheduler) return scheduler;
  }
  // 2. Otherwise over libfabric only, fusing queued calls there
  //    (network_fusion.h) if every rank does: a rank with
  //    SMDDP_FUSION_BUFFER_BYTES=0 would never read its peers' cut
  //    proposals. (Different budgets are harmless: the cut is the least
  //    proposal.)
  //    Every rank must send the same type across hosts, too, and take the
  //    same calls in pairwise rounds (their sends go in another order).
  bool fusing = false;
  if (ctx.size() > 1) {
    fusing = true;
    const std::string rounds =
        "SMDDP_ROUNDS_MIN_HOSTS=" + std::to_string(tunables.roundsMinHosts) +
        " SMDDP_ROUNDS_MIN_BYTES=" + std::to_string(tunables.roundsMinBytes);
    const auto votes = gatherVotesSameWire(ctx, bootstrap, "netfusion",
                                           (tunables.fusionBytes > 0 ? "on " : "off ") + rounds);
    for (size_t r = 0; r < votes.size(); ++r) {
      const size_t space = votes[r].find(' ');
      fusing = fusing && votes[r].substr(0, space) == "on";
      const std::string theirs = space == std::string::npos ? "" : votes[r].substr(space + 1);
      SMDDP_CHECK(theirs == rounds, kInvalidArgument,
                  "group '" + ctx.name() + "': rank " + std::to_string(ctx.rank()) + " has " +
                      rounds + " but rank " + std::to_string(r) + " has " + theirs +
                      "; they must be the same on every rank");
    }
  }
  if (!config.serverHosts.empty() && ctx.peers().hostCount() > 1 && ctx.rank() == 0) {
    SMDDP_LOG(kWarn) << "SMDDP_SERVER_HOSTS is set, but group '" << ctx.name()
                     << "' takes the network-only allreduce path, which does not use standalone "
                        "reduction servers (docs/design.md, \"Standalone reduction servers\")";
  }
  if (config.crossHostDtype != DataType::kFloat32 && ctx.peers().hostCount() > 1 &&
      !narrowsOnNetwork(ctx, DataType::kFloat32, ReduceOp::kSum) && ctx.rank() == 0) {
    SMDDP_LOG(kWarn) << "SMDDP_CROSS_HOST_DTYPE is " << toString(config.crossHostDtype)
                     << ", but group '" << ctx.name() << "' takes the network-only allreduce path ("
                     << networkOnly << "), where partials cross hosts in their own dtype";
  }
  if (fusing) return openNetworkFusion(ctx, std::move(networkOnly));
  return openNetworkAllreduce(ctx, std::move(networkOnly));
}

EngineParts standardEngineParts() {
  EngineParts parts;
  parts.config = readEngineConfig();
  parts.openAllreducePath = openAllreducePath;
  return parts;
}

}  // namespace smddp
