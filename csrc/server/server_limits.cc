#include "server/server_limits.h"

#include <unistd.h>

#include <algorithm>

#include "common/param.h"
#include "reduce/narrow_wire.h"
#include "server/server_wire.h"

namespace smddp {

SMDDP_PARAM_INT(paramMaxConnections, "SMDDP_SERVER_MAX_CONNECTIONS", 1024, 4, 1 << 20,
                "connections a standalone reduction server holds open at once, handshakes "
                "included (each stream holds at least one, so this bounds streams and their "
                "threads too); past it the oldest unproven connection of the source address "
                "holding the most makes room, or the new one is refused")

SMDDP_PARAM_INT(paramUnprovenPerSource, "SMDDP_SERVER_UNPROVEN_PER_SOURCE", 64, 1, 1 << 20,
                "connections from one source address a standalone reduction server holds at "
                "once, per port, before they prove the key; past it that source's own oldest "
                "unproven connection makes room, so a flood from one address never drops "
                "another's handshake")

SMDDP_PARAM_INT(paramJobConnections, "SMDDP_SERVER_JOB_CONNECTIONS", 768, 1, 1 << 20,
                "connections of one job id a standalone reduction server holds at once, across "
                "its ports, once they proved the key; past it that job's next host is refused, "
                "so one job (or a key holder naming it) cannot take every connection")

SMDDP_PARAM_INT(paramMaxWait, "SMDDP_SERVER_MAX_WAIT", 1800, 1, 86400,
                "seconds a standalone reduction server keeps an incomplete stream waiting for "
                "its other hosts at most, whatever wait their hellos announce (a worker's "
                "SMDDP_SERVER_WAIT; the default is torch's default group timeout)")
SMDDP_PARAM_BYTES(paramMemoryBudget, "SMDDP_SERVER_MEMORY_BUDGET", 0, 0, int64_t{1} << 50,
                  "bytes a standalone reduction server may reserve for its streams' pieces: for "
                  "each host, three times its largest piece (four with SMDDP_WIRE_ENCRYPT) and "
                  "its share of the stream's f32 room for a bf16 or f16 combine; a host "
                  "whose hello would pass it is refused, naming the budget (0: half the "
                  "machine's memory)")

std::chrono::seconds serverMaxWaitParam() { return std::chrono::seconds(paramMaxWait()); }

namespace {

// What a host's connection reserves of the memory budget, from its
// hello's largest piece P (bytes) and group of H hosts: its piece as it is
// read, one read ahead and the result sent back (3P); encrypting
// (SMDDP_WIRE_ENCRYPT), the result's ciphertext too (P); and its share of
// the stream's f32 room for a narrow step (stream_service.cc,
// combineNarrow): the f32 sum of a bf16 or f16 piece (2P) and H + 1
// widened chunks of at most kNarrowWireScratch floats each, over H hosts.
// Far less is resident while pieces are small; this bounds what hellos
// can make the server promise.
int64_t reservedBytes(const ServerFrame& hello) {
  const int64_t piece = static_cast<int64_t>(hello.count);
  const int64_t hosts = std::max<int64_t>(hello.hosts, 1);
  const int64_t chunk = std::min<int64_t>(2 * piece, kNarrowWireScratch * sizeof(float));
  const int64_t f32Room = 2 * piece + (hosts + 1) * chunk;
  return (hello.flags & kServerFlagEncrypt ? 4 : 3) * piece + (f32Room + hosts - 1) / hosts;
}

int64_t defaultMemoryBudget() {
  const long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || size <= 0) return int64_t{4} << 30;
  return static_cast<int64_t>(pages) * size / 2;
}

// Takes `bytes` of `pool` if that stays within `budget` (any thread).
bool reserve(std::atomic<int64_t>& pool, int64_t bytes, int64_t budget) {
  int64_t now = pool.load();
  do {
    if (bytes > budget - now) return false;
  } while (!pool.compare_exchange_weak(now, now + bytes));
  return true;
}

std::string mib(int64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

}  // namespace

bool JobQuota::take(const std::string& job) {
  std::lock_guard<std::mutex> g(mu_);
  auto& n = held_[job];
  if (n >= limit_) return false;
  ++n;
  return true;
}

void JobQuota::give(const std::string& job) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = held_.find(job);
  if (it != held_.end() && --it->second <= 0) held_.erase(it);
}

ServerLimits::ServerLimits(int64_t maxConnections, int64_t unprovenPerSource,
                           int64_t jobConnections, int64_t memoryBudget)
    : maxConnections_(maxConnections > 0 ? maxConnections : paramMaxConnections()),
      unprovenPerSource_(unprovenPerSource > 0 ? unprovenPerSource : paramUnprovenPerSource()),
      memoryBudget_(memoryBudget > 0 ? memoryBudget : paramMemoryBudget()),
      jobQuota_(jobConnections > 0 ? jobConnections : paramJobConnections()) {
  if (memoryBudget_ <= 0) memoryBudget_ = defaultMemoryBudget();
}

ServerLimits::Room ServerLimits::roomFor(const std::map<std::string, int64_t>& unprovenBySource,
                                         const std::string& source, int64_t open,
                                         std::string* evict) const {
  // A source past its share makes room itself: its own oldest goes,
  // whatever the total.
  const auto mine = unprovenBySource.find(source);
  if (mine != unprovenBySource.end() && mine->second >= unprovenPerSource_) {
    *evict = source;
    return Room::kEvict;
  }
  if (open <= maxConnections_) return Room::kFits;
  // Full: the oldest unproven connection of the source that holds the
  // most makes room (a worker proves itself within a round trip, so that
  // is a flood's); with none, the new one is turned away.
  int64_t most = 0;
  for (const auto& [who, n] : unprovenBySource) {
    if (n > most) most = n, *evict = who;
  }
  return most == 0 ? Room::kFull : Room::kEvict;
}

std::string ServerLimits::roomSettings() const {
  return "(SMDDP_SERVER_MAX_CONNECTIONS=" + std::to_string(maxConnections_) +
         ", SMDDP_SERVER_UNPROVEN_PER_SOURCE=" + std::to_string(unprovenPerSource_) + ")";
}

std::string ServerLimits::grant(const ServerFrame& hello, const std::string& job,
                                std::unique_ptr<HostGrant>* out) {
  if (hello.hosts > kServerMaxHosts) {
    return "a group of " + std::to_string(hello.hosts) + " hosts (a server serves groups of 2 to " +
           std::to_string(kServerMaxHosts) + ")";
  }
  if (!jobQuota_.take(job)) {
    return "job '" + job + "' already holds " + std::to_string(jobQuota_.limit()) +
           " connections to this server (SMDDP_SERVER_JOB_CONNECTIONS)";
  }
  JobSlot slot(&jobQuota_, job);
  const int64_t charge = reservedBytes(hello);
  if (!reserve(reserved_, charge, memoryBudget_)) {
    return "host " + std::to_string(hello.host) + "'s pieces of up to " + mib(hello.count) +
           " would reserve " + mib(charge) + " (its pieces, the result and its share of the "
           "f32 room), past the server's memory budget: " + mib(reserved_.load()) + " of its " +
           mib(memoryBudget_) + " (SMDDP_SERVER_MEMORY_BUDGET) are reserved";
  }
  *out = std::make_unique<HostGrant>(HostGrant{HeldBytes(reserved_, charge), std::move(slot)});
  return "";
}

}  // namespace smddp
