// The Communicator's setup and teardown (communicator.h): rendezvous,
// provider and endpoint, the peer table and control plane, the allreduce
// path; then progress(), which hands each completion to its owner, and
// shutdown. The queue and worker thread are in task_queue.cc.
#include "engine/communicator.h"

#include <rdma/fi_errno.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <random>
#include <thread>
#include <sstream>

#include "common/error.h"
#include "common/logging.h"
#include "common/param.h"
#include "algorithms/algorithms.h"
#include "engine/exchange.h"
#include "hostpath/fusion_scheduler.h"
#include "hostpath/host_path.h"
#include "hostpath/host_segment.h"

namespace smddp {

SMDDP_PARAM_INT(paramSpinUs, "SMDDP_SPIN_US", 50, 0, 1000000,
                "microseconds a waiting engine thread polls before it starts to sleep")
SMDDP_PARAM_INT(paramSleepUs, "SMDDP_SLEEP_US", 100, 1, 100000,
                "longest sleep between polls of an idle engine thread, in microseconds")
SMDDP_PARAM_BOOL(paramHostPath, "SMDDP_SHM_ALLREDUCE", true,
                 "allreduce through each host's shared-memory segment (fusion buffers, reduction "
                 "servers on the ranks' engine threads; hosts combine over libfabric); 0 = network only")
SMDDP_PARAM_INT(paramServersPerNode, "SMDDP_SERVERS_PER_NODE", 0, 0, 64,
                "reduction servers per host (0: one per rank, the bandwidth-optimal default)")
EngineConfig EngineConfig::fromEnvironment() {
  // Each part is read next to the code that uses it (its SMDDP_PARAM_*
  // declarations sit there too).
  EngineConfig c;
  c.spinUs = paramSpinUs();
  c.sleepUs = paramSleepUs();
  c.hostPath = paramHostPath();
  c.serversPerNode = paramServersPerNode();
  readExchangeParams(c);
  readAllreduceParams(c);
  readHostPathParams(c);
  readFusionParams(c);
  return c;
}

namespace {

uint64_t randomSecret() {
  std::random_device rd;
  uint64_t s = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return s ? s : 1;
}

}  // namespace

Communicator::Communicator(Bootstrap& store, CommOptions opts)
    : opts_(std::move(opts)), timeoutMs_(opts_.timeout.count()),
      config_(EngineConfig::fromEnvironment()) {
  SMDDP_CHECK(opts_.size >= 1 && opts_.rank >= 0 && opts_.rank < opts_.size, kInvalidArgument,
              "invalid rank " + std::to_string(opts_.rank) + " for world size " +
                  std::to_string(opts_.size));
  // 0. This group instance's own key space: a store reused by a later
  //    group (or a restarted job) still holds the keys of earlier ones.
  storePrefix_ =
      "smddp/" + joinGroupInstance(store, opts_.rank, opts_.size, opts_.timeout, opts_.name) + "/";
  PrefixBootstrap bootstrap(store, storePrefix_);
  // 1. Who is where: host identity, pid, PID namespace and shm owner of every rank.
  peers_.gather(bootstrap, opts_.rank, opts_.size, opts_.timeout);
  const bool oneHost = peers_.oneHost();
  // Network-path reduction servers: every rank, or SMDDP_SERVERS_PER_NODE
  // ranks per host spread over its ranks (as on the shared-memory path).
  for (const auto& ranks : peers_.ranksByHost()) {
    const int local = static_cast<int>(ranks.size());
    const int k = config_.serversPerNode > 0
                      ? std::min<int>(local, static_cast<int>(config_.serversPerNode))
                      : local;
    for (int s = 0; s < k; ++s) netServers_.push_back(ranks[s * local / k]);
  }
  std::sort(netServers_.begin(), netServers_.end());
  // The network path's receive ring: across hosts, more than two chunks
  // per peer in flight only queue at the link (benchmarks/RESULTS.md,
  // "The network path's ring across hosts").
  if (config_.ringDepth == 0) config_.ringDepth = oneHost ? 4 : 2;
  // 2. The same provider on every rank (everyone saw the same host list).
  provider_ = chooseProvider(oneHost, &providerReason_);
  if (provider_ == "shm" && peers_.sharesProcess() &&
      providerReason_.rfind("SMDDP_FI_PROVIDER", 0) != 0) {
    // Ranks that are threads of one process (torchft's tests, say): the shm
    // provider hands an endpoint of the process its peer's own region
    // rather than a mapping of it, so a peer that closes first leaves the
    // others a dangling pointer (a crash in their next send).
    provider_ = "tcp;ofi_rxm";
    providerReason_ = "ranks of this group share a process: tcp with the rxm reliability layer";
  }
  // 3. A per-group secret: frames without it are dropped.
  if (opts_.rank == 0) {
    jobSecret_ = randomSecret();
    bootstrap.set("secret", std::to_string(jobSecret_));
  } else {
    jobSecret_ = std::stoull(bootstrap.get("secret", opts_.timeout));
  }
  sink_.reserve();
  // 4. Endpoint and addresses. libfabric's shm provider refuses a /dev/shm
  //    it finds too small, and its region may not fit: then every rank of
  //    the one-host job takes tcp instead (never one rank alone).
  std::vector<std::string> shmTrouble;  // why shared memory was given up, per path
  const bool forced = providerReason_.rfind("SMDDP_FI_PROVIDER", 0) == 0;
  std::string shmStatus = "ok";
  try {
    fabric_ = std::make_shared<Fabric>(provider_);
    endpoint_ = std::make_unique<Endpoint>(fabric_);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kTransport || provider_ != "shm" || forced) throw;
    shmStatus = e.what();
    endpoint_.reset();
    fabric_.reset();
  }
  if (provider_ == "shm" && !forced) {
    auto verdicts = bootstrapAllGather(bootstrap, opts_.rank, opts_.size, "shmprovider",
                                       shmStatus, opts_.timeout);
    auto bad = std::find_if(verdicts.begin(), verdicts.end(),
                            [](const std::string& v) { return v != "ok"; });
    if (bad != verdicts.end()) {
      // libfabric refuses shm when /dev/shm has less free space than its
      // region size times the cores, and our reservation may not fit.
      shmTrouble.push_back("libfabric's shm provider is unusable on rank " +
                           std::to_string(bad - verdicts.begin()) + " (" + *bad +
                           "; it wants its region size per core free in /dev/shm)");
      provider_ = "tcp;ofi_rxm";
      providerReason_ = "one host, but the shm provider is unusable on some rank";
      endpoint_.reset();
      fabric_.reset();
    }
  }
  if (!endpoint_) {
    fabric_ = std::make_shared<Fabric>(provider_);
    endpoint_ = std::make_unique<Endpoint>(fabric_);
  }
  auto names = bootstrapAllGather(bootstrap, opts_.rank, opts_.size, "addr",
                                  endpoint_->name(), opts_.timeout);
  peers_.watch(bootstrap, *endpoint_, endpoint_->insertPeers(names), jobSecret_, opts_.timeout);
  control_.start(*endpoint_, jobSecret_, overflowSink());
  // 5. Allreduce through each host's shared segment when the layout allows.
  if (config_.hostPath && opts_.size > 1) {
    std::vector<std::string> hosts;
    std::vector<std::string> owners;
    for (const auto& p : peers_.all()) {
      hosts.push_back(p.host);
      owners.push_back(p.owner);
    }
    std::string whyNot;
    scheduler_ = openHostPath(*this, bootstrap, hosts, owners, &networkOnlyReason_, &whyNot);
    if (!whyNot.empty()) shmTrouble.push_back(whyNot);
  }
  // Otherwise allreduce runs over libfabric only, and fuses queued calls
  // there (network_fusion.h) if every rank does: a rank with
  // SMDDP_FUSION_BUFFER_BYTES=0 would never read its peers' cut proposals.
  // (Different budgets are harmless: the cut is the least proposal.)
  if (!scheduler_ && opts_.size > 1) {
    auto fusing = bootstrapAllGather(bootstrap, opts_.rank, opts_.size, "netfusion",
                                     config_.fusionBytes > 0 ? "on" : "off", opts_.timeout);
    netFusion_ = std::all_of(fusing.begin(), fusing.end(),
                             [](const std::string& v) { return v == "on"; });
  }
  if (!config_.serverHosts.empty() && peers_.hostCount() > 1 && !scheduler_ && opts_.rank == 0) {
    SMDDP_LOG(kWarn) << "SMDDP_SERVER_HOSTS is set, but group '" << opts_.name
                     << "' takes the network-only allreduce path, which does not use standalone "
                        "reduction servers (docs/design.md, \"Standalone reduction servers\")";
  }
  if (!shmTrouble.empty()) {
    // Every rank reached the same verdicts; one of them says so, once.
    std::string text;
    for (const auto& t : shmTrouble) text += (text.empty() ? "" : "; ") + t;
    text += ". Collectives use " + provider_ +
            " on every rank instead. A container's /dev/shm is 64 MiB unless it is started "
            "with a larger --shm-size (e.g. docker run --shm-size=1g)";
    if (opts_.rank == 0) SMDDP_LOG(kWarn) << text;
    else SMDDP_LOG(kDebug) << text;
  }
  // 6. The flight recorder, and a thread that tells a failing peer where
  //    this rank stands (desync.h).
  if (const int64_t ring = traceBufferSize(); ring > 0) {
    recorder_ = std::make_shared<FlightRecorder>(opts_.name, opts_.rank, opts_.size,
                                                 static_cast<size_t>(ring));
    // The answering thread blocks in the store: its own connection. Asking
    // is a few quick calls: the group's connection.
    auto waitStore = store.clone();
    auto askStore = waitStore ? store.share() : nullptr;
    if (askStore) {
      desync_ = std::make_unique<DesyncResponder>(std::move(waitStore), std::move(askStore),
                                                  storePrefix_, recorder_);
    }
  }
  worker_ = std::thread([this] { workerLoop(); });
  SMDDP_LOG(kInfo) << describeGroup();
}

std::string Communicator::describeGroup() const {
  auto kib = [](uint64_t b) { return std::to_string(b >> 10) + " KiB"; };
  std::ostringstream o;
  o << "[rank " << opts_.rank << "] group '" << opts_.name << "': " << opts_.size << " rank(s) on "
    << peers_.hostCount() << " host(s); provider " << provider_ << " (" << providerReason_
    << "); allreduce ";
  if (scheduler_) {
    const HostSegment& seg = scheduler_->segment();
    o << "through each host's shared-memory segment" << (peers_.hostCount() > 1
                                                             ? ", then across hosts over libfabric"
                                                             : "")
      << ": " << seg.servers() << " reduction server(s) per host, slot " << kib(seg.slotBytes())
      << " x depth " << seg.depth() << ", fusion buffer " << kib(scheduler_->fusionBytes());
    if (scheduler_->standaloneServers() > 0) {
      o << ", plus " << scheduler_->standaloneServers()
        << " standalone reduction server(s) across hosts (SMDDP_SERVER_HOSTS)";
    }
  } else {
    const std::string why = !config_.hostPath ? "SMDDP_SHM_ALLREDUCE=0"
                            : opts_.size == 1  ? "one rank"
                                               : networkOnlyReason_;  // openHostPath's
    o << "over libfabric only (" << why << "): " << netServers_.size()
      << " reduction server(s), chunk " << kib(config_.chunkBytes) << ", ring depth "
      << config_.ringDepth << ", "
      << (netFusion_ ? "fusion buffer " + kib(config_.fusionBytes) : std::string("no fusion"));
  }
  if (const PeerMonitor* monitor = peers_.monitor()) {
    o << "; liveness connections to " << monitor->watchedRanks().size()
      << " rank(s) on other hosts (port " << monitor->listenPort() << ", SMDDP_PEER_TIMEOUT "
      << PeerMonitor::configuredSilence().count() / 1000 << " s)";
  }
  return o.str();
}

Communicator::~Communicator() {
  shutdown();
  if (!stuck_) return;
  // The owner should have leaked a Communicator whose worker is stuck in
  // the provider (stuck()); destroying it under the running thread would
  // free memory that thread still uses. Give the thread the group timeout
  // to come back, then stop the process rather than corrupt it.
  {
    std::unique_lock<std::mutex> lock(queueMu_);
    if (!exitedCv_.wait_for(lock, timeout(),
                            [&] { return workerExited_ && !runningOnCaller_; })) {
      SMDDP_LOG(kError) << "group '" << opts_.name << "' rank " << opts_.rank
                        << ": destroyed while its engine thread is still stuck inside libfabric; "
                           "aborting the process instead of freeing memory that thread uses";
      std::abort();
    }
  }
  releaseResources();
}

void Communicator::shutdown() {
  std::deque<Task> leftover;
  {
    std::lock_guard<std::mutex> lock(queueMu_);
    if (stopping_ && !worker_.joinable()) return;
    stopping_ = true;
    stopRequested_ = true;
    leftover.swap(queue_);
    queued_.store(0);
    for (const Task& t : leftover) forgetUnfinishedLocked(t.seq);
  }
  queueCv_.notify_all();
  for (auto& t : leftover) {
    const std::string why = "smddp: " + t.name() + " at sequence " + std::to_string(t.seq) +
                            " was not run: the process group was shut down";
    if (recorder_ && !t.p2p) recorder_->ended(t.seq, &why, 1, std::chrono::steady_clock::now());
    try {
      if (t.done) (*t.done)(std::make_exception_ptr(Error(ErrorKind::kAborted, why)));
    } catch (...) {
    }
  }
  // Every wait of the engine honours stop within about 100 ms. A call
  // into the provider cannot be interrupted, though: libfabric's shm send
  // spins on the peer region's lock, which a peer stopped (SIGSTOP) inside
  // its own progress holds until it runs again. Then give up on the thread
  // running the call (the worker, or a caller running its own call): fail
  // the unfinished calls as aborted and leave the thread, and everything it
  // may still touch, allocated (stuck() tells the owner to leak this
  // object), rather than hold abort and destroy for as long as the peer
  // stays stopped.
  constexpr auto kGiveUp = std::chrono::milliseconds(500);
  bool callerReturned, workerExited = true;
  {
    // A caller running its own call (runOnCaller) sees stopRequested_ at
    // its next wait and returns; nothing below may go before it has.
    std::unique_lock<std::mutex> lock(queueMu_);
    callerReturned = queueCv_.wait_for(lock, kGiveUp, [&] { return !runningOnCaller_; });
  }
  if (worker_.joinable()) {
    {
      std::unique_lock<std::mutex> lock(queueMu_);
      workerExited = exitedCv_.wait_for(lock, kGiveUp, [&] { return workerExited_; });
    }
    if (workerExited) {
      worker_.join();
    } else {
      worker_.detach();
    }
  }
  if (!callerReturned || !workerExited) {
    stuck_ = true;
    std::vector<std::pair<uint64_t, std::shared_ptr<CallDone>>> unfinished;
    {
      std::lock_guard<std::mutex> lock(queueMu_);
      unfinished.swap(unfinished_);
    }
    SMDDP_LOG(kWarn) << "group '" << opts_.name << "' rank " << opts_.rank
                     << ": the thread running a call is stuck inside libfabric (a peer stopped "
                        "while holding its shared-memory lock?); its "
                     << unfinished.size()
                     << " unfinished call(s) fail as aborted and the group's resources are "
                        "left allocated";
    for (auto& [seq, done] : unfinished) {
      try {
        (*done)(std::make_exception_ptr(Error(
            ErrorKind::kAborted, "smddp: the call at sequence " + std::to_string(seq) +
                                     " was aborted: the process group was shut down while "
                                     "it was stuck in the transport")));
      } catch (...) {
      }
    }
    return;
  }
  releaseResources();
}

void Communicator::releaseResources() {
  desync_.reset();        // its answering thread ends (or is left behind on a hung store)
  peers_.closeMonitor();  // says goodbye: peers on other hosts do not take this for a death
  scheduler_.reset();
  // Point-to-point operations still posted get an "aborted" completion.
  failP2P("the process group was shut down", false);
  // Closing the endpoint discards whatever is still posted; only then may
  // the requests' memory go. A quarantined endpoint is never closed: it
  // holds receives that were never confirmed cancelled (and sends to a
  // peer that is gone), and fi_close progresses it one last time. rxm
  // (libfabric 1.17, over tcp) then flushes its connections' completion
  // queue and runs its handlers over those abandoned transfers: a late
  // receive may land in memory handed back long ago, and an error
  // completion without a context crashes it (SIGSEGV in
  // rxm_handle_comp_error under rxm_ep_close, seen in test_cluster's
  // link-down case when many cross-host steps were in flight). Nothing
  // progresses a leaked endpoint (manual progress), so the requests, the
  // sink and the buffers its operations point into can go; its sockets
  // and provider memory stay until the process exits, like a held send's
  // buffer.
  if (quarantined_) {
    SMDDP_LOG(kDebug) << "group '" << opts_.name << "' rank " << opts_.rank
                      << ": its quarantined endpoint is left open, never closed";
    (void)endpoint_.release();  // deliberately leaked, with the fabric it holds
  } else {
    endpoint_.reset();
  }
  fabric_.reset();
  control_.close();  // their requests go with requests_
  requests_.clear();
  sink_.release();
  peers_.releaseLocks();
}

void Communicator::Sink::reserve() {
  void* p = mmap(nullptr, kSinkBytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  SMDDP_CHECK(p != MAP_FAILED, kInternal, "cannot reserve the overflow sink");
  base = p;
}

void Communicator::Sink::release() {
  if (base) munmap(base, kSinkBytes);
  base = nullptr;
}

int Communicator::reductionServers() const {
  return scheduler_ ? scheduler_->segment().servers() : static_cast<int>(netServers_.size());
}

int Communicator::standaloneServers() const {
  return scheduler_ ? scheduler_->standaloneServers() : 0;
}

size_t Communicator::progress() {
  if (quarantined_) return 0;
  Completion batch[16];
  size_t n = endpoint_->poll(batch, 16);
  progressing_ = true;
  struct Reset {
    bool& flag;
    ~Reset() { flag = false; }
  } reset{progressing_};
  if (control_.hasPending()) control_.retryPending();
  for (size_t i = 0; i < n; ++i) {
    Request* r = static_cast<Request*>(batch[i].context);
    if (!r || !requests_.owns(r)) continue;
    if (r->owner) {
      r->owner->complete(r, batch[i]);
    } else if (r->onComplete) {
      auto onComplete = std::move(r->onComplete);
      r->onComplete = nullptr;
      --p2pInFlight_;
      onComplete(r, batch[i]);
      requests_.release(r);
    } else if (r->type == Request::Type::kErrorRecv) {
      control_.handleFrame(r, batch[i]);
    } else {
      requests_.release(r);  // orphaned, cancelled, or a fire-and-forget error send
    }
  }
  return n;
}

void Communicator::quarantine(const std::string& why) {
  if (quarantined_) return;
  quarantined_ = true;
  control_.markBroken(why);
  SMDDP_LOG(kWarn) << "group '" << opts_.name << "' rank " << opts_.rank
                   << " stops using its endpoint: " << why;
  failP2P(why, false);
}

void Communicator::holdForSend(Request* r) {
  if (!callHeld_) callHeld_ = std::make_shared<HeldMemory>();
  r->held = callHeld_;
  stats_.abandonedSendsHeld++;
}

uint8_t* Communicator::scratch(size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

uint8_t* Communicator::fusionBuffer(size_t bytes) {
  if (fusion_.size() < bytes) fusion_.resize(bytes);
  return fusion_.data();
}

}  // namespace smddp
