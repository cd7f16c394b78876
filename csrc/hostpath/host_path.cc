#include "hostpath/host_path.h"

#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "algorithms/algorithms_config.h"
#include "common/error.h"
#include "common/param.h"
#include "common/logging.h"
#include "engine/engine_context.h"
#include "hostpath/fusion_scheduler.h"
#include "hostpath/host_collectives.h"
#include "hostpath/host_segment.h"
#include "server/server_auth.h"
#include "server/server_link.h"

namespace smddp {

SMDDP_PARAM_BYTES(paramShmSlotBytes, "SMDDP_SHM_SLOT_BYTES", 0, 0, 1LL << 28,
                  "bytes of one shard per pipeline step in the shared-memory segment "
                  "(0: 128K, or 256K across hosts or when a host has more ranks than cores)")
SMDDP_PARAM_INT(paramShmDepth, "SMDDP_SHM_DEPTH", 0, 0, 64,
                "pipeline steps the shared-memory allreduce keeps in flight (0: 4, or 16 across "
                "hosts or when a host has more ranks than cores)")

SMDDP_PARAM_BYTES(paramStageBytes, "SMDDP_STAGE_BYTES", 67108864, 0, 1LL << 40,
                  "on one host, the most bytes of private input an all-gather or reduce-scatter "
                  "copies into the shared pool at a time for its peers to read in place (and "
                  "the pool range each rank keeps for it); a larger call runs in pieces of this "
                  "size, one after another (0: none staged, the peers read private inputs with "
                  "process_vm_readv or the rings; else at least 1 MiB)")

SMDDP_PARAM_BYTES(paramEagerGatherBytes, "SMDDP_EAGER_GATHER_BYTES", 262144, 0, 1048576,
                  "on one host, an all-gather whose private part is at most this long copies it "
                  "into the shared pool and leaves once it read its peers' parts, one "
                  "synchronization instead of two (0: never; off with SMDDP_STAGE_BYTES=0)")

SMDDP_PARAM_STRING(paramServerHosts, "SMDDP_SERVER_HOSTS", "",
                   "standalone reduction servers (python -m torch_smddp.server) as host:port,... "
                   "in server order; across hosts the shared-memory path shards each step over "
                   "them as over the hosts' own servers (empty: none)")
SMDDP_PARAM_STRING(paramServerJob, "SMDDP_SERVER_JOB", "",
                   "the job id this job gives the standalone reduction servers; a server "
                   "started with --job refuses any other")

SMDDP_PARAM_INT(paramServerCount, "SMDDP_SERVER_COUNT", 0, 0, 1024,
                "standalone reduction servers to find in the job's store, registered by python "
                "-m torch_smddp.server --rendezvous --job SMDDP_SERVER_JOB (0: none; ignored "
                "when SMDDP_SERVER_HOSTS is set)")

// Read through serverLookupParams by torch_smddp/__init__.py, which looks
// the servers up in the store.
SMDDP_PARAM_STRING(paramServerRendezvous, "SMDDP_SERVER_RENDEZVOUS", "",
                   "with SMDDP_SERVER_COUNT: the TCPStore (HOST:PORT) the servers registered in "
                   "(empty: the job's own store; under torchrun's c10d rendezvous, its "
                   "--rdzv-endpoint)")

SMDDP_PARAM_INT(paramServerShare, "SMDDP_SERVER_SHARE", -1, -1, 100,
                "percent of each cross-host step the standalone reduction servers take "
                "together (-1: what balances the bytes when every link has one speed)")

SMDDP_PARAM_INT(paramServerWait, "SMDDP_SERVER_WAIT", 60, 0, 86400,
                "seconds a worker waits at group creation for each standalone reduction server "
                "to accept (a server may start after the workers; at most half the group "
                "timeout); the group goes on without one that some rank could not reach by then")
SMDDP_PARAM_STRING(paramCrossHostDtype, "SMDDP_CROSS_HOST_DTYPE", "fp32",
                   "what f32 host partials cross hosts in on the shared-memory path, and f32 "
                   "sums on the network-only path of one rank per host: fp32, bf16 "
                   "or fp16 (f16 scaled per piece by a power of two, so it never overflows); "
                   "each host reduces in f32, the hosts' servers (standalone ones too) "
                   "accumulate in f32 and return "
                   "the result in this type (SUM and AVG of f32, f16 and bf16 only; the same "
                   "on every rank; a group's torch_smddp.Options(cross_host_dtype=...) "
                   "overrides it); a hierarchical reduce-scatter's f32 SUM and AVG host sums "
                   "cross in it too, and are added in f32 at their owner")

SMDDP_PARAM_BOOL(paramServerRequired, "SMDDP_SERVER_REQUIRED", false,
                 "a standalone reduction server unreachable at group creation fails the group "
                 "instead of being left out")

void readHostPathParams(EngineConfig& c) {
  HostPathConfig h;
  readFusionParams(h);
  h.serverWaitSeconds = paramServerWait();
  h.serverRequired = paramServerRequired();
  c.serverHosts = parseServerHosts(paramServerHosts());
  h.serverSharePercent = static_cast<int>(paramServerShare());
  c.serverCount = paramServerCount();
  h.serverJob = paramServerJob();
  SMDDP_CHECK(h.serverJob.size() <= 256, kInvalidArgument,
              "SMDDP_SERVER_JOB is longer than 256 bytes");
  h.shmSlotBytes = static_cast<uint64_t>(paramShmSlotBytes()) & ~uint64_t{63};
  if (paramShmSlotBytes() > 0 && h.shmSlotBytes < 4096) {
    throwError(ErrorKind::kInvalidArgument,
               "SMDDP_SHM_SLOT_BYTES must be 0 (automatic) or at least 4096");
  }
  h.shmDepth = paramShmDepth();
  h.stageBytes = static_cast<uint64_t>(paramStageBytes());
  if (h.stageBytes > 0 && h.stageBytes < (uint64_t{1} << 20)) {
    throwError(ErrorKind::kInvalidArgument,
               "SMDDP_STAGE_BYTES must be 0 (no staging) or at least 1 MiB (1048576), not " +
                   std::to_string(h.stageBytes));
  }
  h.eagerBytes = static_cast<uint64_t>(paramEagerGatherBytes());
  c.layers.set(h);
  c.crossHostDtype = parseCrossHostDtype(paramCrossHostDtype(), "SMDDP_CROSS_HOST_DTYPE");
}

ServerLookup serverLookupParams() {
  ServerLookup l;
  l.count = paramServerCount();
  l.job = paramServerJob();
  l.rendezvous = paramServerRendezvous();
  l.hostsGiven = !parseServerHosts(paramServerHosts()).empty();
  SMDDP_CHECK(l.count == 0 || l.hostsGiven || !l.job.empty(), kInvalidArgument,
              "SMDDP_SERVER_COUNT is set without SMDDP_SERVER_JOB: the job id the servers "
              "registered under (python -m torch_smddp.server --job ID)");
  return l;
}


unsigned onlineCores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

SegmentGeometry hostSegmentGeometry(const EngineConfig& c, int localSize, int hosts,
                                    unsigned cores) {
  SegmentGeometry g;
  if (!c.hostPath) {
    g.unused = "SMDDP_SHM_ALLREDUCE=0";
  } else if (localSize * hosts <= 1) {
    g.unused = "one rank";
  } else if (localSize > kHostMaxRanks) {
    g.unused = "more than " + std::to_string(kHostMaxRanks) + " ranks on a host";
  } else if (localSize == 1 && hosts > 1 && c.serverHosts.empty()) {
    // One rank per host, across hosts: a host segment would only add a
    // copy in, a copy out and a step per slot, for the same bytes on the
    // link as the network-only path, which fuses queued calls too (at 2
    // Gbit/s, 64 MiB: 2 x 1 hosts 88% of the link bound through the
    // segment, 93-97% without; benchmarks/RESULTS.md), and sends a narrow
    // SMDDP_CROSS_HOST_DTYPE's wire form there (narrowsOnNetwork).
    // Standalone reduction servers are reached from the hierarchical path
    // only, so they keep it.
    g.unused = "one rank per host";
  }
  if (!g.unused.empty()) return g;
  g.servers = localSize;
  if (c.serversPerNode > 0) g.servers = std::min<int>(g.servers, c.serversPerNode);
  // The slot size sets the step size, which the hosts' servers must agree
  // on (the network step pairs them by step): across hosts it is fixed.
  // Across hosts each step also crosses the network, where a step's round
  // trip is far longer than in memory: larger steps and a deeper ring keep
  // the link busy (at 2 Gbit/s, 2 hosts x 2 ranks, 64 MiB: 26% of the link
  // bound with 128 KiB x 4 on a loaded machine; 93% with 256 KiB x 16 and
  // the pipelined network step on a quiet one; benchmarks/RESULTS.md).
  // Oversubscribed hosts (more ranks than cores) get a deeper pipeline too:
  // a rank then runs in time slices and should cover more steps in each.
  g.deep = localSize > static_cast<int>(cores) || hosts > 1;
  const HostPathConfig& h = hostPathConfig(c);
  g.slotBytes = h.shmSlotBytes ? h.shmSlotBytes : (g.deep ? 262144 : 131072);
  g.depth = h.shmDepth ? static_cast<int>(h.shmDepth) : (g.deep ? 16 : 4);
  g.bytes = HostSegment::bytesFor(localSize, g.servers, g.slotBytes, g.depth);
  return g;
}

namespace {

// Across hosts, each host server rank connects to every standalone
// reduction server (SMDDP_SERVER_HOSTS), into `links`; every rank learns
// which of them every server rank reached, so the whole group leaves out
// the same ones (failover: a server that died, then a restarted job) or
// raises the same error, instead of a timeout somewhere. Returns how many
// the group uses.
int linkStandaloneServers(EngineContext& ctx, Bootstrap& bootstrap, const HostTopology& topo,
                          const HostSegment& seg, std::unique_ptr<ServerLinks>* links) {
  const EngineConfig& config = ctx.config();
  const int K = static_cast<int>(config.serverHosts.size());
  if (K == 0 || topo.hosts() == 1) return 0;
  std::string error;
  std::vector<std::string> unreachable;
  // A server that died under an earlier group of some rank's process
  // (torchft rebuilds the group after a failure) gets one quick attempt
  // from every rank, not SMDDP_SERVER_WAIT: the group goes on without it.
  std::string mine(K, '0');
  for (int i = 0; i < K; ++i) {
    if (ServerLinks::knownDown(config.serverHosts[i])) mine[i] = '1';
  }
  std::vector<bool> quick(K, false);
  for (const auto& v : bootstrapAllGather(bootstrap, ctx.rank(), ctx.size(), "serversdown", mine,
                                          ctx.waits().timeout())) {
    for (int i = 0; i < K && i < static_cast<int>(v.size()); ++i) quick[i] = quick[i] || v[i] == '1';
  }
  const int stream = seg.serverIndexOf(topo.localRank);
  if (stream >= 0) {
    try {
      ServerLinks::Identity me;
      me.job = hostPathConfig(config).serverJob;
      me.group = serverGroupId(ctx.jobSecret());  // the secret itself never leaves the group
      me.hosts = topo.hosts();
      me.host = topo.hostIndex;
      me.stream = stream;
      me.rank = ctx.rank();
      me.key = workerServerKey(config.serverKey);
      me.integrity = serverIntegrityParam();
      me.encrypt = wireEncryptParam();
      me.maxPiece = seg.slotBytes();  // a step's pieces fit in one slot
      const auto wait = std::min<std::chrono::milliseconds>(
          std::chrono::seconds(hostPathConfig(config).serverWaitSeconds),
          ctx.waits().timeout() / 2);
      *links = std::make_unique<ServerLinks>(config.serverHosts, me, wait, quick);
      unreachable = (*links)->unreachable();
    } catch (const Error& e) {
      error = e.what();
    }
  }
  auto reports = bootstrapAllGather(bootstrap, ctx.rank(), ctx.size(), "serverlinks",
                                    reachStatus(error, unreachable, K), ctx.waits().timeout());
  const ServerVerdict verdict =
      agreeOnServers(reports, K, hostPathConfig(config).serverRequired);
  if (!verdict.error.empty()) throwError(ErrorKind::kPeerLost, verdict.error);
  const int inUse = verdict.inUse();
  if (inUse < K) {
    std::string text = "group '" + ctx.name() + "' goes on with " +
                       std::to_string(inUse) + " of " + std::to_string(K) +
                       " standalone reduction server(s), leaving out what some rank could not "
                       "reach within SMDDP_SERVER_WAIT (SMDDP_SERVER_REQUIRED=1 makes that an "
                       "error): ";
    for (int i = 0, n = 0; i < K; ++i) {
      if (!verdict.live[i]) text += (n++ ? "; " : "") + verdict.why[i];
    }
    if (ctx.rank() == 0) SMDDP_LOG(kWarn) << text;
    else SMDDP_LOG(kDebug) << text;
    if (*links) (*links)->keep(verdict.live);
    if (inUse == 0) links->reset();
  }
  return inUse;
}

}  // namespace

HostTopology HostTopology::of(const std::vector<std::string>& hostOfRank, int rank) {
  HostTopology t;
  std::vector<std::string> names;
  for (int r = 0; r < static_cast<int>(hostOfRank.size()); ++r) {
    auto it = std::find(names.begin(), names.end(), hostOfRank[r]);
    size_t h = static_cast<size_t>(it - names.begin());
    if (it == names.end()) {
      names.push_back(hostOfRank[r]);
      t.ranksOfHost.emplace_back();
    }
    if (r == rank) {
      t.hostIndex = static_cast<int>(h);
      t.localRank = static_cast<int>(t.ranksOfHost[h].size());
    }
    t.ranksOfHost[h].push_back(r);
  }
  t.localSize = static_cast<int>(t.ranksOfHost[t.hostIndex].size());
  return t;
}

bool HostTopology::uniform() const {
  for (const auto& h : ranksOfHost) {
    if (h.size() != ranksOfHost[0].size()) return false;
  }
  return true;
}

std::vector<std::string> gatherVotesSameWire(EngineContext& ctx, Bootstrap& bootstrap,
                                             const std::string& key, const std::string& vote) {
  const std::string wire = toString(ctx.config().crossHostDtype);
  auto all = bootstrapAllGather(bootstrap, ctx.rank(), ctx.size(), key, wire + " " + vote,
                                ctx.waits().timeout());
  for (size_t r = 0; r < all.size(); ++r) {
    const size_t space = all[r].find(' ');
    const std::string theirs = all[r].substr(0, space);
    SMDDP_CHECK(theirs == wire, kInvalidArgument,
                "group '" + ctx.name() + "': rank " + std::to_string(ctx.rank()) +
                    " has SMDDP_CROSS_HOST_DTYPE (or cross_host_dtype) " + wire + " but rank " +
                    std::to_string(r) + " has " + theirs + "; it must be the same on every rank");
    all[r] = space == std::string::npos ? "" : all[r].substr(space + 1);
  }
  return all;
}

std::unique_ptr<FusionBufferScheduler> openHostPath(EngineContext& ctx, Bootstrap& bootstrap,
                                                    const std::vector<std::string>& hostOfRank,
                                                    const std::vector<std::string>& ownerOfRank,
                                                    std::string* reason, std::string* whyNot) {
  const EngineConfig& config = ctx.config();
  HostTopology topo = HostTopology::of(hostOfRank, ctx.rank());
  if (!topo.uniform()) {
    *reason = "the hosts hold different numbers of ranks";
    return nullptr;
  }
  const unsigned cores = onlineCores();
  const SegmentGeometry geometry = hostSegmentGeometry(config, topo.localSize, topo.hosts(), cores);
  if (!geometry.unused.empty()) {  // too many ranks per host, or one across hosts
    *reason = geometry.unused;
    return nullptr;
  }
  const int leader = topo.ranksOfHost[topo.hostIndex][0];
  // Named after the leader's shm owner (see transport/shm_owner.h), which
  // creates it, so that the sweeper knows whose it is; the rest is random.
  const std::string owner = ownerOfRank[leader].empty() ? "x" : ownerOfRank[leader];
  topo.oversubscribed = topo.localSize > static_cast<int>(cores);
  std::string status = "ok";
  std::unique_ptr<HostSegment> seg;
  try {
    PrefixBootstrap local(bootstrap, "host" + std::to_string(topo.hostIndex) + "/");
    seg = std::make_unique<HostSegment>(local, topo.localRank, topo.localSize, geometry.servers,
                                        geometry.slotBytes, geometry.depth, owner,
                                        ctx.waits().timeout());
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kTransport) throw;
    status = e.what();
  }
  // Every host must take the same path, and send the same type across.
  auto all = gatherVotesSameWire(ctx, bootstrap, "hostpath", status);
  auto bad = std::find_if(all.begin(), all.end(), [](const std::string& s) { return s != "ok"; });
  if (bad != all.end()) {
    *reason = "shared memory is unavailable on some rank";
    *whyNot = "the host segment is unavailable on rank " + std::to_string(bad - all.begin()) +
              " (" + *bad + ")";
    if (bad->find(kNoRoomText) != std::string::npos) {
      *whyNot += "; SMDDP_SHM_SLOT_BYTES and SMDDP_SHM_DEPTH shrink it";
    }
    return nullptr;
  }
  std::unique_ptr<ServerLinks> links;
  const int inUse = linkStandaloneServers(ctx, bootstrap, topo, *seg, &links);
  SegmentCollectives::NotOpened notOpened;
  std::unique_ptr<SegmentCollectives> direct =
      SegmentCollectives::open(ctx, bootstrap, *seg, topo, &notOpened);
  if (!direct && !notOpened.switchedOff && ctx.rank() == 0) {
    SMDDP_LOG(kWarn) << "group '" << ctx.name()
                     << "': all-gather and reduce-scatter go over the network, not through "
                        "shared memory: "
                     << notOpened.why << " (SMDDP_SHM_COLLECTIVES=0 says so without this warning)";
  }
  auto scheduler = std::make_unique<FusionBufferScheduler>(ctx, std::move(seg), std::move(topo),
                                                           algorithmsConfig(config).fusionBytes);
  if (direct) scheduler->setHostCollectives(std::move(direct));
  if (inUse > 0) {
    scheduler->setStandaloneServers(inUse);
    if (links) scheduler->setServerLinks(std::move(links));
  }
  return scheduler;
}

}  // namespace smddp
