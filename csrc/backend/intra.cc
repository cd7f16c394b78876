#include "backend/intra.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <thread>

#include "backend/liveness_grace.h"
#include "backend/process_group.h"
#include "common/logging.h"
#include "common/param.h"
#include "device/nccl_host.h"

namespace c10d_smddp {

static const ::smddp::ParamRegistrar paramIntraRegistrar_{
    "SMDDP_INTRA", "string", "auto",
    "The GPU path's allreduce inside a host: nccl (reduce-scatter over the host's GPUs with "
    "NCCL, only each GPU's shard across hosts, then all-gather), shm (every GPU's data "
    "through the host), or auto (shm until the NCCL route has passed the multi-GPU checks on "
    "hardware; docs/gpu.md)",
    __FILE__};

std::string intraMode() {
  try {
    return smddp::readStringParam("SMDDP_INTRA", "auto", {"auto", "nccl", "shm"});
  } catch (const smddp::Error& e) {
    TORCH_CHECK_VALUE(false, e.what());
  }
}

SMDDP_PARAM_INT(paramSimRailDelayMs, "SMDDP_DEVICE_SIM_RAIL_DELAY_MS", 0, 0, 60000,
                "Test hook (stand-in only): on the NCCL route, local ranks other than 0 wait this "
                "many ms before forming their rail group, so their host's rank 0 forms first");

namespace {

// Whether SMDDP_INTRA=auto may pick NCCL inside a host. False until a lent
// machine with 2 or more GPUs passes scripts/gpu_check.sh's multi-GPU stage
// on the NCCL route (issue 53); then true, with that run in
// benchmarks/RESULTS.md.
constexpr bool kNcclIntraProvenOnHardware = false;

// This group instance's keys: under the nonce of the group's own
// formation (IntraSetup::instance), so a group formed again with the same
// name on the same store never reads an earlier instance's keys.
std::string keyBase(const IntraSetup& s) { return "smddp_intra/" + s.instance + s.groupName + "/"; }

using Clock = std::chrono::steady_clock;

// What is left of the route's one deadline: the whole formation, every
// step of it, is bounded by the group timeout (not each step by it).
std::chrono::milliseconds left(Clock::time_point deadline) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return std::max(ms, std::chrono::milliseconds(1));
}

// The value of `key`, once a rank has set it, by `deadline`; meanwhile
// the group's liveness (IntraSetup::alive) is checked every few ms.
std::string getWithin(const IntraSetup& s, c10d::Store& store, const std::string& key,
                      Clock::time_point deadline) {
  constexpr auto kAlivePoll = std::chrono::milliseconds(10);
  try {
    if (s.alive) {
      while (!store.check({key}) && Clock::now() < deadline) {
        s.alive();
        std::this_thread::sleep_for(kAlivePoll);
      }
    }
    store.wait({key}, left(deadline));
    auto bytes = store.get(key);
    return std::string(bytes.begin(), bytes.end());
  } catch (const std::exception&) {
    // A lost rank is named as the group's liveness names it, which may see
    // the death a moment after the store does (its host gone: "Connection
    // reset by peer"), or after the wait timed out.
    if (s.alive) giveLivenessItsMoment(s.alive, kAlivePoll);
    throw;
  }
}

std::string errorText(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

// The route's last step, on every rank: each says whether its part formed,
// and none returns until every rank's part has (and rank 0 not until every
// other rank has read the verdicts). Without it a rank whose
// part formed first could queue its work, abort or destroy the group, or
// exit (taking the store with it on rank 0) while a peer still forms its
// rail group or communicator through the store. A part that failed fails
// every rank the same way, naming the rank, within the deadline.
void confirmFormed(const IntraSetup& s, Clock::time_point deadline, const std::string& failure) {
  auto store = c10::make_intrusive<c10d::PrefixStore>(keyBase(s) + "formed/", s.store);
  const std::string mine = failure.empty() ? "ok" : failure;
  store->set(std::to_string(s.rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  if (!failure.empty()) return;  // the caller raises its own error
  for (int r = 0; r < s.size; ++r) {
    if (r == s.rank) continue;
    std::string theirs;
    try {
      theirs = getWithin(s, *store, std::to_string(r), deadline);
    } catch (const c10::DistStoreError& e) {
      C10_THROW_ERROR(DistBackendError,
                      "smddp: group " + s.groupName + ": the intra-host NCCL route did not form "
                      "on rank " + std::to_string(r) + " within the group timeout (" +
                      std::to_string(s.timeout.count()) + " ms): " + e.what_without_backtrace());
    }
    if (theirs != "ok") {
      C10_THROW_ERROR(DistBackendError, "smddp: group " + s.groupName +
                                            ": the intra-host NCCL route failed to form on rank " +
                                            std::to_string(r) + ": " + theirs);
    }
  }
  // The group's rank 0 leaves last: it usually hosts the store, and a rank
  // still reading the others' verdicts would lose it if rank 0 went ahead,
  // issued, aborted and exited.
  if (s.rank != 0) {
    store->set("read/" + std::to_string(s.rank), std::vector<uint8_t>{1});
    return;
  }
  for (int r = 1; r < s.size; ++r) {
    try {
      (void)getWithin(s, *store, "read/" + std::to_string(r), deadline);
    } catch (const c10::DistStoreError& e) {
      C10_THROW_ERROR(DistBackendError,
                      "smddp: group " + s.groupName + ": rank " + std::to_string(r) +
                          " did not confirm the intra-host NCCL route within the group timeout (" +
                          std::to_string(s.timeout.count()) + " ms): " + e.what_without_backtrace());
    }
  }
}

// Every rank must ask for the same route: a rank on shm never takes part
// in the others' NCCL set-up. Each publishes its SMDDP_INTRA (as written,
// when it is not a valid value), rank 0 compares them and publishes the
// verdict, and every rank raises the same error when they differ.
void agreeOnMode(const IntraSetup& s, const std::string& mine, Clock::time_point deadline) {
  auto store = c10::make_intrusive<c10d::PrefixStore>(keyBase(s) + "mode/", s.store);
  store->set(std::to_string(s.rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  if (s.rank == 0) {
    std::string verdict = "ok";
    for (int r = 1; r < s.size && verdict == "ok"; ++r) {
      const std::string theirs = getWithin(s, *store, std::to_string(r), deadline);
      if (theirs != mine) {
        verdict = "SMDDP_INTRA differs across the ranks of group " + s.groupName + ": rank 0 has '" +
                  mine + "', rank " + std::to_string(r) + " has '" + theirs +
                  "' (every rank must set the same value)";
      }
    }
    store->set("verdict", std::vector<uint8_t>(verdict.begin(), verdict.end()));
  }
  const std::string verdict = getWithin(s, *store, "verdict", deadline);
  TORCH_CHECK_VALUE(verdict == "ok", verdict);
}

// Every rank's device index, through the store.
std::vector<int> deviceIndexes(const IntraSetup& s, int mine, Clock::time_point deadline) {
  auto store = c10::make_intrusive<c10d::PrefixStore>(keyBase(s) + "dev/", s.store);
  const std::string v = std::to_string(mine);
  store->set(std::to_string(s.rank), std::vector<uint8_t>(v.begin(), v.end()));
  std::vector<int> out(static_cast<size_t>(s.size));
  for (int r = 0; r < s.size; ++r) {
    out[r] = std::stoi(getWithin(s, *store, std::to_string(r), deadline));
  }
  return out;
}

// The host's communicator's unique id: local rank 0 makes it and
// publishes it under `key`; the others wait for it, within the timeout.
std::string uniqueIdOfHost(const IntraSetup& s, smddp::NcclApi& nccl, const std::string& key,
                           int localRank, Clock::time_point deadline) {
  if (localRank == 0) {
    std::string id = nccl.uniqueId();
    s.store->set(key, std::vector<uint8_t>(id.begin(), id.end()));
    return id;
  }
  return getWithin(s, *s.store, key, deadline);
}

// Where this rank sits: its host, its index on that host (its rail).
struct Place {
  int host = 0;
  int local = 0;
  int gpusPerHost = 1;
};

// This rank's part of the NCCL route: the host's communicator, the rail
// group of the GPUs with its index on every host, and the shards' scratch.
std::shared_ptr<IntraRoute> formRoute(const IntraSetup& s, DeviceContext& ctx, size_t slotBytes,
                                      int slots, const Place& at, Clock::time_point deadline) {
  auto route = std::make_shared<IntraRoute>();
  route->hosts = static_cast<int>(s.ranksByHost.size());
  const std::string base = keyBase(s);
  std::shared_ptr<smddp::NcclApi> nccl =
      s.sim ? makeSimNcclApi(s.store, s.groupName + "/host" + std::to_string(at.host), s.timeout,
                             0x5eedull + static_cast<uint64_t>(s.rank) * 7919)
            : cudaNcclApi();
  {
    auto entered = ctx.enter();  // the communicator forms on the rank's device
    route->stream = ctx.device()->newStream();
    const std::string id =
        uniqueIdOfHost(s, *nccl, base + "nccl/" + std::to_string(at.host), at.local, deadline);
    try {
      route->host = smddp::newNcclIntraHost(nccl, ctx.device()->name(), at.local, at.gpusPerHost,
                                            id, s.timeout);
    } catch (const smddp::Error& e) {
      C10_THROW_ERROR(DistBackendError, e.what());
    }
  }
  if (s.sim && at.local > 0 && paramSimRailDelayMs() > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(paramSimRailDelayMs()));
  }
  route->rail = c10::make_intrusive<ProcessGroupSmddp>(
      c10::make_intrusive<c10d::PrefixStore>(base + "rail" + std::to_string(at.local) + "/", s.store),
      at.host, route->hosts, s.timeout, s.groupName + "/rail" + std::to_string(at.local),
      GroupOptions{.hostOnly = true, .servers = s.servers, .crossHostDtype = s.crossHostDtype});
  auto entered = ctx.enter();
  const auto opts = at::TensorOptions().dtype(at::kByte).device(ctx.torchDevice());
  for (int i = 0; i < slots; ++i) {
    route->scratch.push_back(at::empty({static_cast<int64_t>(slotBytes)}, opts));
  }
  return route;
}

// Why the NCCL route cannot be taken here, or empty where it can.
std::string whyNotNccl(const IntraSetup& s, DeviceContext& ctx, Clock::time_point deadline) {
  const auto& hosts = s.ranksByHost;
  const size_t g = hosts.empty() ? 1 : hosts[0].size();
  const bool even = std::all_of(hosts.begin(), hosts.end(), [&](const auto& h) { return h.size() == g; });
  const std::vector<int> devices = deviceIndexes(s, ctx.device()->index(), deadline);
  bool distinct = true;
  for (const auto& h : hosts) {
    std::set<int> seen;
    for (int r : h) distinct &= seen.insert(devices[r]).second;
  }
  if (g < 2) return "one GPU per host";
  if (!even) return "hosts with different numbers of GPUs";
  if (!distinct) return "ranks of one host share a GPU";
  return "";
}

Place placeOf(const IntraSetup& s) {
  Place at;
  const auto& hosts = s.ranksByHost;
  at.gpusPerHost = hosts.empty() ? 1 : static_cast<int>(hosts[0].size());
  for (size_t h = 0; h < hosts.size(); ++h) {
    auto it = std::find(hosts[h].begin(), hosts[h].end(), s.rank);
    if (it != hosts[h].end()) {
      at.host = static_cast<int>(h);
      at.local = static_cast<int>(it - hosts[h].begin());
    }
  }
  return at;
}

}  // namespace

std::shared_ptr<IntraRoute> makeIntraRoute(const IntraSetup& s, DeviceContext& ctx,
                                           size_t slotBytes, int slots, std::string* why) {
  // The mode as this rank wrote it, checked only once every rank's is known,
  // so a bad value on one rank fails every rank the same way.
  std::string mode, invalid;
  try {
    mode = intraMode();
  } catch (const c10::Error& e) {
    const char* raw = std::getenv("SMDDP_INTRA");
    mode = raw ? raw : "";
    invalid = e.what_without_backtrace();
  }
  const Clock::time_point deadline = Clock::now() + s.timeout;
  agreeOnMode(s, mode, deadline);
  TORCH_CHECK_VALUE(invalid.empty(), invalid);
  if (mode == "shm") {
    *why = "SMDDP_INTRA=shm";
    return nullptr;
  }
  if (mode == "auto" && !kNcclIntraProvenOnHardware) {
    *why = "SMDDP_INTRA=auto: every GPU's data goes through the host (the NCCL route inside a "
           "host has not yet run on hardware with 2 or more GPUs; SMDDP_INTRA=nccl asks for it)";
    return nullptr;
  }
  // Every rank reaches the same verdict: it rests on what the store holds.
  const std::string reason = whyNotNccl(s, ctx, deadline);
  if (!reason.empty()) {
    TORCH_CHECK_VALUE(mode != "nccl", "SMDDP_INTRA=nccl: the intra-host NCCL path cannot be "
                      "used here: ", reason, " (use SMDDP_INTRA=auto or shm)");
    *why = "SMDDP_INTRA=" + mode + ": " + reason + ", so every GPU's data goes through the host";
    return nullptr;
  }
  if (mode == "nccl" && !kNcclIntraProvenOnHardware && s.rank == 0) {
    SMDDP_LOG(kWarn) << "smddp: SMDDP_INTRA=nccl: group " << s.groupName << " takes the NCCL route "
                     << "inside the host, which has not yet been proven on hardware with 2 or more "
                     << "GPUs (docs/gpu.md); SMDDP_INTRA=shm or auto is the host route";
  }
  const Place at = placeOf(s);
  std::shared_ptr<IntraRoute> route;
  try {
    route = formRoute(s, ctx, slotBytes, slots, at, deadline);
  } catch (const std::exception& e) {
    const std::string text = errorText(e);
    confirmFormed(s, deadline, text.empty() ? "an unnamed error" : text);
    throw;
  }
  confirmFormed(s, deadline, "");
  *why = "SMDDP_INTRA=" + mode + ": " + std::to_string(at.gpusPerHost) + " GPUs on each of " +
         std::to_string(route->hosts) + " hosts: reduce-scatter inside the host, 1/" +
         std::to_string(at.gpusPerHost) + " of each chunk across hosts, all-gather";
  return route;
}

}  // namespace c10d_smddp
