#include "engine/communicator.h"

#include <rdma/fi_errno.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <future>
#include <random>
#include <thread>
#include <sstream>

#include "common/caller_waiting.h"
#include "common/error.h"
#include "common/logging.h"
#include "common/param.h"
#include "engine/algorithms.h"
#include "engine/exchange.h"
#include "engine/fusion_scheduler.h"
#include "engine/host_path.h"

namespace smddp {

SMDDP_PARAM_BYTES(paramChunkBytes, "SMDDP_CHUNK_BYTES", 262144, 4096, 1LL << 30,
                  "largest message on the wire; bigger shards are pipelined in chunks of this size")
SMDDP_PARAM_BYTES(paramMinShardBytes, "SMDDP_MIN_SHARD_BYTES", 16384, 1, 1LL << 30,
                  "a call smaller than servers x this goes whole to one server (round-robin)")
SMDDP_PARAM_INT(paramRingDepth, "SMDDP_RING_DEPTH", 4, 1, 1024,
                "chunks per peer a reduction server keeps in flight (cache-resident receive ring)")
SMDDP_PARAM_INT(paramMaxPostedRecvs, "SMDDP_MAX_POSTED_RECVS", 256, 8, 100000,
                "receives one collective keeps posted at once (shm holds about 1024 in all)")
SMDDP_PARAM_INT(paramSpinUs, "SMDDP_SPIN_US", 50, 0, 1000000,
                "microseconds a waiting engine thread polls before it starts to sleep")
SMDDP_PARAM_INT(paramStreamSpinUs, "SMDDP_STREAM_SPIN_US", 500, 0, 1000000,
                "microseconds a rank polls inside a shared-memory allreduce's data steps, where "
                "its peers are working on the same call, before it sleeps (hosts with more ranks "
                "than cores use SMDDP_SPIN_US instead)")
SMDDP_PARAM_INT(paramSleepUs, "SMDDP_SLEEP_US", 100, 1, 100000,
                "longest sleep between polls of an idle engine thread, in microseconds")
SMDDP_PARAM_BOOL(paramHostPath, "SMDDP_SHM_ALLREDUCE", true,
                 "allreduce through each host's shared-memory segment (fusion buffers, reduction "
                 "servers on the ranks' engine threads; hosts combine over libfabric); 0 = network only")
SMDDP_PARAM_BYTES(paramFusionBytes, "SMDDP_FUSION_BUFFER_BYTES", 33554432, 0, 1LL << 34,
                  "queued allreduce calls are fused up to this many bytes (0: no fusion)")
SMDDP_PARAM_BYTES(paramShmSlotBytes, "SMDDP_SHM_SLOT_BYTES", 0, 0, 1LL << 28,
                  "bytes of one shard per pipeline step in the shared-memory segment "
                  "(0: 128K, or 256K when a host has more ranks than cores)")
SMDDP_PARAM_INT(paramShmDepth, "SMDDP_SHM_DEPTH", 0, 0, 64,
                "pipeline steps the shared-memory allreduce keeps in flight (0: 4, or 16 when a "
                "host has more ranks than cores, so a rank's time slice covers more work)")
SMDDP_PARAM_INT(paramServersPerNode, "SMDDP_SERVERS_PER_NODE", 0, 0, 64,
                "reduction servers per host (0: one per rank, the bandwidth-optimal default)")
SMDDP_PARAM_BYTES(paramStreamingBytes, "SMDDP_STREAMING_STORE_BYTES", 4194304, 0, 1LL << 50,
                  "fusion buffers at least this large copy results out with non-temporal stores")
SMDDP_PARAM_STRING(paramHostId, "SMDDP_HOST_ID", "",
                   "host identity this rank reports (default: the hostname); splits one machine "
                   "into pretend hosts")

EngineConfig EngineConfig::fromEnvironment() {
  EngineConfig c;
  c.chunkBytes = static_cast<uint64_t>(paramChunkBytes());
  c.minShardBytes = static_cast<uint64_t>(paramMinShardBytes());
  c.ringDepth = paramRingDepth();
  c.maxPostedRecvs = paramMaxPostedRecvs();
  c.spinUs = paramSpinUs();
  c.streamSpinUs = paramStreamSpinUs();
  c.sleepUs = paramSleepUs();
  c.hostPath = paramHostPath();
  c.fusionBytes = static_cast<uint64_t>(paramFusionBytes());
  c.shmSlotBytes = static_cast<uint64_t>(paramShmSlotBytes()) & ~uint64_t{63};
  if (paramShmSlotBytes() > 0 && c.shmSlotBytes < 4096) {
    throwError(ErrorKind::kInvalidArgument,
               "SMDDP_SHM_SLOT_BYTES must be 0 (automatic) or at least 4096");
  }
  c.shmDepth = paramShmDepth();
  c.serversPerNode = paramServersPerNode();
  c.streamingBytes = static_cast<uint64_t>(paramStreamingBytes());
  return c;
}

namespace {

std::string hostIdentity() {
  std::string forced = paramHostId();
  if (!forced.empty()) return forced;
  char buf[256] = {0};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

// True when /proc says the process is gone or a zombie.
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

Communicator::Communicator(Bootstrap& bootstrap, CommOptions opts)
    : opts_(std::move(opts)), timeoutMs_(opts_.timeout.count()),
      config_(EngineConfig::fromEnvironment()) {
  SMDDP_CHECK(opts_.size >= 1 && opts_.rank >= 0 && opts_.rank < opts_.size, kInvalidArgument,
              "invalid rank " + std::to_string(opts_.rank) + " for world size " +
                  std::to_string(opts_.size));
  // 1. Who is where: host identity and pid of every rank.
  std::string me = hostIdentity() + "\n" + std::to_string(getpid());
  auto all = bootstrapAllGather(bootstrap, opts_.rank, opts_.size, "smddp/peer", me, opts_.timeout);
  bool oneHost = true;
  for (const auto& s : all) {
    PeerInfo p;
    size_t nl = s.find('\n');
    p.host = s.substr(0, nl);
    p.pid = nl == std::string::npos ? 0 : std::stoll(s.substr(nl + 1));
    oneHost = oneHost && p.host == hostIdentity();
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
    for (const auto& ranks : ranksOf) {
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
    bootstrap.set("smddp/secret", std::to_string(jobSecret_));
  } else {
    jobSecret_ = std::stoull(bootstrap.get("smddp/secret", opts_.timeout));
  }
  sink_ = mmap(nullptr, kSinkBytes, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  SMDDP_CHECK(sink_ != MAP_FAILED, kInternal, "cannot reserve the overflow sink");
  // 4. Endpoint and addresses.
  fabric_ = std::make_shared<Fabric>(provider_);
  endpoint_ = std::make_unique<Endpoint>(fabric_);
  auto names = bootstrapAllGather(bootstrap, opts_.rank, opts_.size, "smddp/addr",
                                  endpoint_->name(), opts_.timeout);
  peerAddrs_ = endpoint_->insertPeers(names);
  postErrorReceives();
  // 5. Allreduce through each host's shared segment when the layout allows.
  if (config_.hostPath && opts_.size > 1) {
    std::vector<std::string> hosts;
    std::vector<int64_t> pids;
    for (const auto& p : peers_) {
      hosts.push_back(p.host);
      pids.push_back(p.pid);
    }
    scheduler_ = openHostPath(*this, bootstrap, hosts, pids);
  }
  worker_ = std::thread([this] { workerLoop(); });
  SMDDP_LOG(kInfo) << "group '" << opts_.name << "' rank " << opts_.rank << "/" << opts_.size
                   << " using provider " << provider_ << " (" << providerReason_ << ")";
}

Communicator::~Communicator() { shutdown(); }

void Communicator::shutdown() {
  std::deque<Task> leftover;
  {
    std::lock_guard<std::mutex> lock(queueMu_);
    if (stopping_ && !worker_.joinable()) return;
    stopping_ = true;
    stopRequested_ = true;
    leftover.swap(queue_);
    queued_.store(0);
  }
  queueCv_.notify_all();
  for (auto& t : leftover) {
    try {
      t.done(std::make_exception_ptr(
          Error(ErrorKind::kAborted, "smddp: " + t.what + " at sequence " + std::to_string(t.seq) +
                                         " was not run: the process group was shut down")));
    } catch (...) {
    }
  }
  if (worker_.joinable()) worker_.join();
  scheduler_.reset();
  // Point-to-point operations still posted get an "aborted" completion.
  failP2P("the process group was shut down", false);
  // Closing the endpoint discards whatever is still posted; only then may
  // the requests' memory go.
  endpoint_.reset();
  fabric_.reset();
  requests_.clear();
  freeRequests_.clear();
  if (sink_ && sink_ != MAP_FAILED) munmap(sink_, kSinkBytes);
  sink_ = nullptr;
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
  const std::string& myHost = peers_[opts_.rank].host;
  for (int p = 0; p < opts_.size; ++p) {
    if (p == opts_.rank || peers_[p].host != myHost || peers_[p].pid <= 0) continue;
    if (processExited(peers_[p].pid)) {
      throwError(ErrorKind::kPeerLost, "smddp: rank " + std::to_string(p) + " (pid " +
                                           std::to_string(peers_[p].pid) + ") exited during " +
                                           during);
    }
  }
}

uint8_t* Communicator::scratch(size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

uint8_t* Communicator::fusionBuffer(size_t bytes) {
  if (fusion_.size() < bytes) fusion_.resize(bytes);
  return fusion_.data();
}

uint64_t Communicator::enqueue(std::string what, std::function<void(uint64_t)> body, Done done,
                               std::shared_ptr<FusibleCall> fusible) {
  std::unique_lock<std::mutex> lock(queueMu_);
  if (stopping_) {
    throwError(ErrorKind::kAborted, "smddp: cannot start " + what + ": the process group '" +
                                        opts_.name + "' was shut down");
  }
  uint64_t seq = nextSeq_++;
  if (fusible) fusible->seq = seq;
  Task t{seq, std::move(what), std::move(body), std::move(done), false, nullptr};
  t.fusible = std::move(fusible);
  queue_.push_back(std::move(t));
  queued_.store(queue_.size(), std::memory_order_release);
  if (scheduler_) scheduler_->noteIssued(seq + 1);  // under queueMu_, before shutdown
  lock.unlock();
  queueCv_.notify_one();
  return seq;
}

void Communicator::enqueueP2P(std::string what, std::function<void(uint64_t)> body) {
  std::unique_lock<std::mutex> lock(queueMu_);
  if (stopping_) {
    throwError(ErrorKind::kAborted, "smddp: cannot start " + what + ": the process group '" +
                                        opts_.name + "' was shut down");
  }
  Task t{0, std::move(what), std::move(body), nullptr, true, nullptr};
  t.p2p = true;
  queue_.push_back(std::move(t));
  queued_.store(queue_.size(), std::memory_order_release);
  lock.unlock();
  queueCv_.notify_one();
}

void Communicator::workerLoop() {
  // Sleeps between polls are short; the default 50 us timer slack would
  // dominate them.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  while (true) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(queueMu_);
      if (p2pInFlight_ == 0 && queue_.empty() && !stopping_) {
        // Calls often come back to back (a benchmark loop, a caller that
        // waits on each call): poll for SMDDP_SPIN_US, yielding, before
        // sleeping, but only while a caller is waiting, not computing.
        lock.unlock();
        const auto until = std::chrono::steady_clock::now() +
                           std::chrono::microseconds(aCallerIsWaiting() ? config_.spinUs : 0);
        while (queued_.load(std::memory_order_acquire) == 0 &&
               std::chrono::steady_clock::now() < until) {
          sched_yield();
        }
        lock.lock();
        queueCv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      }
      if (queue_.empty()) {
        if (stopping_) return;
        // Point-to-point operations are in flight: keep them moving.
        lock.unlock();
        if (progress() == 0) {
          superviseP2P();
          std::this_thread::sleep_for(std::chrono::microseconds(std::min<int64_t>(config_.sleepUs, 20)));
        }
        continue;
      }
      task = std::move(queue_.front());
      queue_.pop_front();
      queued_.store(queue_.size(), std::memory_order_release);
    }
    if (task.p2p) {
      task.body(task.seq);  // posts and returns; completion comes from progress()
      continue;
    }
    std::vector<Task> tasks;
    tasks.push_back(std::move(task));
    runTasks(tasks);
    if (p2pInFlight_ > 0) superviseP2P();  // their deadlines pass during collectives too
  }
}

void Communicator::runTasks(std::vector<Task>& tasks) {
  std::exception_ptr eptr;
  // By value: the scheduler's takeNext appends to `tasks`, which moves them.
  const uint64_t firstSeq = tasks[0].seq;
  const std::string firstWhat = tasks[0].what;
  if (!brokenReason_.empty()) {
    eptr = std::make_exception_ptr(Error(
        ErrorKind::kAborted, "smddp: " + firstWhat + " at sequence " + std::to_string(firstSeq) +
                                 " refused: the group is unusable after an earlier failure: " +
                                 brokenReason_));
  } else {
    try {
      if (tasks[0].fusible && scheduler_) {
        // The scheduler pulls the calls it fuses straight from the queue.
        std::vector<FusibleCall*> calls{tasks[0].fusible.get()};
        auto takeNext = [&](std::chrono::microseconds wait,
                            const std::function<bool(const FusibleCall&)>& accept,
                            FusibleCall** out) {
          std::unique_lock<std::mutex> lock(queueMu_);
          if (queue_.empty() && wait.count() > 0) {
            queueCv_.wait_for(lock, wait, [&] { return stopping_ || !queue_.empty(); });
          }
          if (stopping_) {
            throwError(ErrorKind::kAborted, "smddp: " + firstWhat + " at sequence " +
                                                std::to_string(firstSeq) +
                                                ": the process group was shut down");
          }
          if (queue_.empty()) return FusionBufferScheduler::Take::kEmpty;
          Task& next = queue_.front();
          if (!next.fusible || next.p2p) return FusionBufferScheduler::Take::kOther;
          if (!accept(*next.fusible)) return FusionBufferScheduler::Take::kOther;
          *out = next.fusible.get();
          tasks.push_back(std::move(next));
          queue_.pop_front();
          queued_.store(queue_.size(), std::memory_order_release);
          return FusionBufferScheduler::Take::kTaken;
        };
        scheduler_->run(calls, takeNext);
      } else {
        tasks[0].body(firstSeq);
      }
    } catch (const Error& e) {
      eptr = std::current_exception();
      stats_.errors++;
      std::string msg = e.what();
      // Timeouts and lost peers leave the group unusable (so did a
      // quarantine during this call): every peer is told, so that their
      // next call fails at once with this cause instead of waiting for us.
      const bool breaks = e.kind() == ErrorKind::kTimeout || e.kind() == ErrorKind::kPeerLost ||
                          e.kind() == ErrorKind::kTransport || !brokenReason_.empty();
      if (breaks && brokenReason_.empty()) brokenReason_ = msg;
      if (msg.find("failed on another rank") == std::string::npos) {
        broadcastError(firstSeq, msg, tasks.size(), breaks);
      }
    } catch (const std::exception& e) {
      eptr = std::make_exception_ptr(Error(ErrorKind::kInternal, e.what()));
      broadcastError(firstSeq, e.what(), tasks.size());
    }
  }
  for (Task& t : tasks) {
    stats_.collectives++;
    try {
      t.done(eptr);
    } catch (const std::exception& e) {
      SMDDP_LOG(kError) << "completion callback of " << t.what << " threw: " << e.what();
    } catch (...) {
      SMDDP_LOG(kError) << "completion callback of " << t.what << " threw";
    }
  }
}

}  // namespace smddp
