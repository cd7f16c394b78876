#include "engine/communicator.h"

#include <rdma/fi_errno.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <future>
#include <random>
#include <thread>
#include <sstream>

#include "common/error.h"
#include "common/logging.h"
#include "common/param.h"
#include "engine/algorithms.h"
#include "engine/exchange.h"
#include "engine/fusion_scheduler.h"
#include "engine/host_path.h"
#include "engine/host_segment.h"
#include "transport/shm_owner.h"

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
SMDDP_PARAM_STRING(paramHostId, "SMDDP_HOST_ID", "",
                   "host identity this rank reports (default: the hostname; the boot_id is "
                   "added); splits one machine into pretend hosts")

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

std::string firstLine(const char* path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

// A host is its host id (SMDDP_HOST_ID, else the hostname) and its boot:
// two machines that share a hostname ("localhost" in some clusters) are
// never taken for one, while containers on one machine with --ipc=host
// (same kernel, same boot_id, same /dev/shm) are.
std::string hostIdentity() {
  std::string id = paramHostId();
  if (id.empty()) {
    char buf[256] = {0};
    gethostname(buf, sizeof(buf) - 1);
    id = buf;
  }
  std::string boot = firstLine("/proc/sys/kernel/random/boot_id");
  return boot.empty() ? id : id + "/" + boot;
}

// "pid:[4026531836]": pids compare only within one PID namespace.
std::string pidNamespace() {
  char buf[64];
  ssize_t n = readlink("/proc/self/ns/pid", buf, sizeof(buf));
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

// True when /proc says the process is gone or a zombie (same PID namespace only).
bool processExited(int64_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  if (!f.good()) return true;
  std::string line;
  std::getline(f, line);
  size_t p = line.rfind(')');
  if (p == std::string::npos || p + 2 >= line.size()) return false;
  char state = line[p + 2];
  return state == 'Z' || state == 'X';
}

// Error and probe frames all travel under this one tag (their sequence
// number is in the header), and their receives are posted with an ignore
// mask of 0. Posting receives with ignore bits set breaks tag matching in
// the shm provider of libfabric 1.17: an unexpected message is queued in a
// receive entry recycled without resetting its `ignore` field
// (smr_get_tag), and a later receive is matched against the queued entry
// with that stale mask (smr_match_tagged), so once an error receive had
// completed, data frames could be delivered to receives of another tag.
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
  // Before anything is named after it: peers watch this owner's lock.
  owner_ = ShmOwner::acquire();
  // 1. Who is where: host identity, pid, PID namespace and shm owner of every rank.
  const std::string myHost = hostIdentity();
  std::string me = myHost + "\n" + std::to_string(getpid()) + "\n" + pidNamespace() + "\n" +
                   (owner_ ? owner_->tag() : "");
  auto all = bootstrapAllGather(bootstrap, opts_.rank, opts_.size, "peer", me, opts_.timeout);
  bool oneHost = true;
  for (const auto& s : all) {
    PeerInfo p;
    std::istringstream fields(s);
    std::string pid;
    std::getline(fields, p.host);
    std::getline(fields, pid);
    std::getline(fields, p.pidNamespace);
    std::getline(fields, p.owner);
    p.pid = pid.empty() ? 0 : std::stoll(pid);
    oneHost = oneHost && p.host == myHost;
    peers_.push_back(p);
  }
  // Network-path reduction servers: every rank, or SMDDP_SERVERS_PER_NODE
  // ranks per host spread over its ranks (as on the shared-memory path).
  {
    std::vector<std::string> hostNames;
    std::vector<std::vector<int>> ranksOf;
    for (int r = 0; r < opts_.size; ++r) {
      auto it = std::find(hostNames.begin(), hostNames.end(), peers_[r].host);
      if (it == hostNames.end()) {
        hostNames.push_back(peers_[r].host);
        ranksOf.emplace_back();
        it = hostNames.end() - 1;
      }
      ranksOf[it - hostNames.begin()].push_back(r);
    }
    hostCount_ = static_cast<int>(ranksOf.size());
    for (const auto& ranks : ranksOf) {
      hostsUneven_ = hostsUneven_ || ranks.size() != ranksOf[0].size();
      const int local = static_cast<int>(ranks.size());
      const int k = config_.serversPerNode > 0
                        ? std::min<int>(local, static_cast<int>(config_.serversPerNode))
                        : local;
      for (int s = 0; s < k; ++s) netServers_.push_back(ranks[s * local / k]);
    }
    std::sort(netServers_.begin(), netServers_.end());
  }
  // 2. The same provider on every rank (everyone saw the same host list).
  provider_ = chooseProvider(oneHost, &providerReason_);
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
  peerAddrs_ = endpoint_->insertPeers(names);
  // Every peer's owner lock exists by now (it was taken before "peer").
  peerLocks_.resize(opts_.size);
  for (int p = 0; p < opts_.size; ++p) {
    if (p != opts_.rank && peers_[p].host == myHost && !peers_[p].owner.empty()) {
      peerLocks_[p] = std::make_unique<OwnerLock>(peers_[p].owner);
    }
  }
  // Peers on other hosts have no owner lock here: a liveness connection to
  // each tells this rank when one dies or its host falls silent.
  if (!oneHost) {
    PeerMonitorOptions m;
    m.rank = opts_.rank;
    m.size = opts_.size;
    m.secret = jobSecret_;
    for (const auto& p : peers_) m.hosts.push_back(p.host);
    m.address = endpoint_->ipAddress();
    m.silence = PeerMonitor::configuredSilence();
    m.setupTimeout = opts_.timeout;
    monitor_ = PeerMonitor::open(bootstrap, std::move(m));
  }
  postErrorReceives();
  // 5. Allreduce through each host's shared segment when the layout allows.
  if (config_.hostPath && opts_.size > 1) {
    std::vector<std::string> hosts;
    std::vector<std::string> owners;
    for (const auto& p : peers_) {
      hosts.push_back(p.host);
      owners.push_back(p.owner);
    }
    std::string whyNot;
    scheduler_ = openHostPath(*this, bootstrap, hosts, owners, &whyNot);
    if (!whyNot.empty()) shmTrouble.push_back(whyNot);
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
    << hostCount_ << " host(s); provider " << provider_ << " (" << providerReason_
    << "); allreduce ";
  if (scheduler_) {
    const HostSegment& seg = scheduler_->segment();
    o << "through each host's shared-memory segment" << (hostCount_ > 1
                                                             ? ", then across hosts over libfabric"
                                                             : "")
      << ": " << seg.servers() << " reduction server(s) per host, slot " << kib(seg.slotBytes())
      << " x depth " << seg.depth() << ", fusion buffer " << kib(scheduler_->fusionBytes());
  } else {
    std::string why = !config_.hostPath  ? "SMDDP_SHM_ALLREDUCE=0"
                      : opts_.size == 1 ? "one rank"
                      : hostsUneven_ ? "the hosts hold different numbers of ranks"
                          : "shared memory is unavailable on some rank";
    o << "over libfabric only (" << why << "): " << netServers_.size()
      << " reduction server(s), chunk " << kib(config_.chunkBytes) << ", ring depth "
      << config_.ringDepth << ", no fusion";
  }
  if (monitor_) {
    o << "; liveness connections to " << monitor_->watchedRanks().size()
      << " rank(s) on other hosts (port " << monitor_->listenPort() << ", SMDDP_PEER_TIMEOUT "
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
    for (const Task& t : leftover) unfinished_.erase(t.seq);
  }
  queueCv_.notify_all();
  for (auto& t : leftover) {
    const std::string why = "smddp: " + t.what + " at sequence " + std::to_string(t.seq) +
                            " was not run: the process group was shut down";
    if (recorder_ && !t.p2p) recorder_->ended(t.seq, &why, 1);
    try {
      t.done(std::make_exception_ptr(Error(ErrorKind::kAborted, why)));
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
    std::map<uint64_t, Done> unfinished;
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
        done(std::make_exception_ptr(Error(
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
  desync_.reset();   // its answering thread ends (or is left behind on a hung store)
  monitor_.reset();  // says goodbye: peers on other hosts do not take this for a death
  scheduler_.reset();
  // Point-to-point operations still posted get an "aborted" completion.
  failP2P("the process group was shut down", false);
  // Closing the endpoint discards whatever is still posted; only then may
  // the requests' memory go.
  endpoint_.reset();
  fabric_.reset();
  pendingControl_.clear();  // their requests go with requests_
  requests_.clear();
  freeRequests_.clear();
  sink_.release();
  peerLocks_.clear();
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

Request* Communicator::newRequest() {
  std::unique_ptr<Request> r;
  if (!freeRequests_.empty()) {
    r = std::move(freeRequests_.back());
    freeRequests_.pop_back();
    *r = Request{};
  } else {
    r = std::make_unique<Request>();
  }
  Request* raw = r.get();
  requests_.emplace(raw, std::move(r));
  return raw;
}

void Communicator::releaseRequest(Request* r) {
  auto it = requests_.find(r);
  if (it == requests_.end()) return;
  r->onArrive = nullptr;
  r->held.reset();  // the last send holding it frees a failed call's memory
  if (freeRequests_.size() < 256) freeRequests_.push_back(std::move(it->second));
  requests_.erase(it);
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
  if (!pendingControl_.empty()) retryPendingControl();
  for (size_t i = 0; i < n; ++i) {
    Request* r = static_cast<Request*>(batch[i].context);
    if (!r || requests_.find(r) == requests_.end()) continue;
    if (r->owner) {
      r->owner->complete(r, batch[i]);
    } else if (r->onComplete) {
      auto onComplete = std::move(r->onComplete);
      r->onComplete = nullptr;
      --p2pInFlight_;
      onComplete(r, batch[i]);
      releaseRequest(r);
    } else if (r->type == Request::Type::kErrorRecv) {
      handleErrorFrame(r, batch[i]);
    } else {
      releaseRequest(r);  // orphaned, cancelled, or a fire-and-forget error send
    }
  }
  return n;
}

void Communicator::noteSignature(uint64_t seq, const CollectiveSignature& sig) {
  history_[seq] = sig;
  while (history_.size() > 64) history_.erase(history_.begin());
  auto it = probes_.find(seq);
  if (it != probes_.end()) {
    // Probes that came in while this call ran but that it never looked at:
    // tell those senders what this rank called.
    for (const auto& [src, theirs] : it->second) {
      if (!(theirs == sig)) sendProbe(src, seq, sig, /*reply=*/true);
    }
  }
  probes_.erase(probes_.begin(), probes_.upper_bound(seq));
}

void Communicator::checkPeersAlive(const std::string& during) {
  PeerFailure f;
  if (monitor_ && monitor_->failed(&f)) {
    throwError(ErrorKind::kPeerLost, "smddp: " + f.who + " " + f.what + " during " + during +
                                         ": " + f.cause);
  }
  // A peer's owner lock is released by the kernel when it dies, whatever
  // PID namespace it runs in; a busy or stopped peer keeps it. /proc is
  // consulted only for a peer in this PID namespace whose lock could not
  // be opened (another /dev/shm).
  const PeerInfo& self = peers_[opts_.rank];
  for (int p = 0; p < opts_.size; ++p) {
    if (p == opts_.rank || peers_[p].host != self.host) continue;
    const bool sameNs = peers_[p].pidNamespace == self.pidNamespace;
    const OwnerLock* lock = peerLocks_.size() > static_cast<size_t>(p) ? peerLocks_[p].get()
                                                                       : nullptr;
    bool gone = false;
    if (lock && lock->valid()) gone = lock->ownerGone();
    else if (sameNs && peers_[p].pid > 0) gone = processExited(peers_[p].pid);
    if (gone) {
      throwError(ErrorKind::kPeerLost,
                 "smddp: rank " + std::to_string(p) + " (pid " + std::to_string(peers_[p].pid) +
                     (sameNs ? "" : " in another PID namespace") + ") exited during " + during);
    }
  }
}

void Communicator::holdForSend(Request* r) {
  if (!callHeld_) callHeld_ = std::make_shared<HeldMemory>();
  r->held = callHeld_;
  stats_.abandonedSendsHeld++;
}

bool Communicator::peerLost(int p) const {
  if (monitor_ && monitor_->lost(p)) return true;
  const OwnerLock* lock = peerLocks_.size() > static_cast<size_t>(p) ? peerLocks_[p].get()
                                                                     : nullptr;
  return lock && lock->valid() && lock->ownerGone();
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
