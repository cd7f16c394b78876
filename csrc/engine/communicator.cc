// The Communicator's set-up and teardown (communicator.h): the context
// (engine_context.cc: rendezvous, provider, endpoint), the allreduce path
// the layers above build, the observer and the worker; then shutdown. The
// queue and worker thread are in task_queue.cc, running a call in
// run_tasks.cc.
#include "engine/communicator.h"

#include <algorithm>
#include <sstream>

#include "common/error.h"
#include "common/logging.h"
#include "common/param.h"
#include "common/thread_name.h"
#include "transport/peer_seal.h"

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

void readEngineParams(EngineConfig& c) {
  c.spinUs = paramSpinUs();
  c.sleepUs = paramSleepUs();
  c.hostPath = paramHostPath();
  c.serversPerNode = paramServersPerNode();
  c.wireEncrypt = wireEncryptParam();
  readExchangeParams(c);
}

Communicator::Communicator(Bootstrap& store, CommOptions opts, EngineParts parts) {
  // 0-4. Key space, peers, provider, secret, endpoint, control plane.
  std::vector<std::string> shmTrouble;  // why shared memory was given up, per path
  ctx_ = std::make_unique<EngineContext>(store, opts, std::move(parts.config), shmTrouble,
                                         laps_);
  // 5. The allreduce path the layout allows (the layers above choose).
  PrefixBootstrap bootstrap(store, ctx_->storePrefix());
  path_ = parts.openAllreducePath(*ctx_, bootstrap, shmTrouble);
  SMDDP_CHECK(path_ != nullptr, kInternal, "smddp: no allreduce path was opened");
  laps_.lap("path");
  fuses_ = path_->fuses();
  pathWords_.allreduce = path_->describe();
  pathWords_.gatherScatter =
      path_->hostCollectives() ? path_->hostCollectives()->describe() : "network, direct exchange";
  warnShmTrouble(shmTrouble);
  // 6. The observer (and its flight recorder), and a thread that tells a
  //    failing peer where this rank stands (desync.h).
  observer_ = std::make_unique<CallObserver>(ctx_->name(), ctx_->rank(), ctx_->size(),
                                             ctx_->counters());
  if (const auto& recorder = observer_->recorder()) {
    // The answering thread blocks in the store: its own connection. Asking
    // is a few quick calls: the group's connection.
    auto waitStore = store.clone();
    auto askStore = waitStore ? store.share() : nullptr;
    if (askStore) {
      ctx_->setDesyncResponder(std::make_unique<DesyncResponder>(
          std::move(waitStore), std::move(askStore), ctx_->storePrefix(), recorder));
    }
  }
  // No call yet: a goodbye now says this rank leaves before call 0.
  ctx_->peers().noteFirstUnfinished(0);
  registerIdleProgressExit();
  worker_ = std::thread([this] {
    smddp::nameThisThread("smddp-engine");
    workerLoop();
  });
  laps_.lap("observer");
  SMDDP_LOG(kInfo) << describeGroup();
}

void Communicator::warnShmTrouble(const std::vector<std::string>& trouble) const {
  if (trouble.empty()) return;
  // Every rank reached the same verdicts; one of them says so, once.
  std::string text;
  for (const auto& t : trouble) text += (text.empty() ? "" : "; ") + t;
  text += ". Collectives use " + provider() +
          " on every rank instead. A container's /dev/shm is 64 MiB unless it is started "
          "with a larger --shm-size (e.g. docker run --shm-size=1g)";
  if (rank() == 0) SMDDP_LOG(kWarn) << text;
  else SMDDP_LOG(kDebug) << text;
}

std::string Communicator::describeGroup() const {
  const PeerTable& peers = ctx_->peers();
  std::ostringstream o;
  o << "[rank " << rank() << "] group '" << name() << "': " << size() << " rank(s) on "
    << peers.hostCount() << " host(s); provider " << provider() << " (" << ctx_->providerReason()
    << "); allreduce " << pathWords_.allreduce << "; all-gather and reduce-scatter "
    << pathWords_.gatherScatter;
  if (const PeerMonitor* monitor = peers.monitor()) {
    o << "; liveness connections to " << monitor->watchedRanks().size()
      << " rank(s) on other hosts (port " << monitor->listenPort() << ", SMDDP_PEER_TIMEOUT "
      << PeerMonitor::configuredSilence().count() / 1000 << " s)";
  }
  o << "; " << laps_.describe();
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
      SMDDP_LOG(kError) << "group '" << name() << "' rank " << rank()
                        << ": destroyed while its engine thread is still stuck inside libfabric; "
                           "aborting the process instead of freeing memory that thread uses";
      std::abort();
    }
  }
  releaseResources();
}

void Communicator::shutdown(bool orderly) {
  std::lock_guard<std::mutex> once(shutdownMu_);
  std::deque<Task> leftover;
  uint64_t leaveBefore = 0;  // the first call this rank will never finish
  {
    std::lock_guard<std::mutex> lock(queueMu_);
    if (stopping_ && !worker_.joinable()) return;
    leaveBefore = firstUnfinishedLocked();
    orderly = orderly && unfinished_.empty();
    stopping_ = true;
    settledLocked();  // a caller waiting for the engine to settle sees the stop
    ctx_->waits().requestStop();
    leftover.swap(queue_);
    queued_.store(0);
    for (const Task& t : leftover) forgetUnfinishedLocked(t.seq);
  }
  queueCv_.notify_all();
  for (auto& t : leftover) {
    const std::string why = "smddp: " + callAt(ctx_->name(), t.name(), t.seq) +
                            " was not run: the process group was shut down";
    if (!t.p2p) observer_->notRun(t.seq, why);
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
    // A caller running its own call (runOnCaller) sees the stop at its
    // next wait and returns; nothing below may go before it has.
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
    abandonStuckCalls();
    return;
  }
  releaseResources(leaveBefore, orderly);
}

void Communicator::abandonStuckCalls() {
  std::vector<std::pair<uint64_t, std::shared_ptr<CallDone>>> unfinished;
  {
    std::lock_guard<std::mutex> lock(queueMu_);
    unfinished.swap(unfinished_);
  }
  SMDDP_LOG(kWarn) << "group '" << name() << "' rank " << rank()
                   << ": the thread running a call is stuck inside libfabric (a peer stopped "
                      "while holding its shared-memory lock?); its "
                   << unfinished.size()
                   << " unfinished call(s) fail as aborted and the group's resources are "
                      "left allocated";
  for (auto& [seq, done] : unfinished) {
    try {
      (*done)(std::make_exception_ptr(Error(
          ErrorKind::kAborted, "smddp: " + callAt(ctx_->name(), "the call", seq) +
                                   " was aborted: the process group was shut down while "
                                   "it was stuck in the transport")));
    } catch (...) {
    }
  }
}

void Communicator::releaseResources(uint64_t leaveBefore, bool orderly) {
  // A peer in a call this rank never ran would wait out the group timeout:
  // every peer hears which call this rank leaves before.
  ctx_->closeLiveness(leaveBefore, orderly);
  path_->release();       // the host segment and the standalone servers' links
  ctx_->release();        // point-to-point, endpoint, requests, sink, owner locks
}

}  // namespace smddp
