// The Communicator's queue and worker thread: callers enqueue collectives
// (each gets the group's next sequence number at once), the overlap fences
// keep call order through fusion, and the one engine thread takes the
// calls in order (run_tasks.cc runs them). Split from communicator.cc, which
// sets the group up.
#include <sched.h>
#include <sys/prctl.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "common/caller_waiting.h"
#include "common/crypto.h"
#include "common/error.h"
#include "common/logging.h"
#include "engine/communicator.h"
#include "observe/timeline.h"

namespace smddp {

namespace {

// Idle progress stops for good when the process exits (exit() with groups
// still alive, as a script that never destroys its groups does): exit
// handlers and destructors then tear down what progress uses (OpenSSL's,
// which checks control frames' MACs, ran under a tick once). Plain atomics:
// they have no destructor of their own to race with.
std::atomic<bool> exiting{false};
std::atomic<int> ticking{0};

void stopIdleProgressAtExit() {
  exiting.store(true);
  // A tick that started before the store ends within one progress call.
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  while (ticking.load() > 0 && std::chrono::steady_clock::now() < until) sched_yield();
}

}  // namespace

void Communicator::registerIdleProgressExit() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Exit handlers run in reverse order of registration: OpenSSL's own
    // (registered when it starts) must run after this one.
    cryptoInit();
    std::atexit(stopIdleProgressAtExit);
  });
}

uint64_t Communicator::push(Task t, CallHooks hooks) {
  std::unique_lock<std::mutex> lock(queueMu_);
  if (hooks.callerWaits) awaitSettledLocked(lock);  // before a sequence is taken
  if (stopping_) {
    throwError(ErrorKind::kAborted, "smddp: cannot start " + t.name() + ": the process group '" +
                                        name() + "' was shut down");
  }
  const uint64_t seq = nextSeq_++;
  t.seq = seq;
  if (t.allreduce) t.allreduce->seq = seq;
  t.queuedAt = std::chrono::steady_clock::now();
  observer_->queued(seq, t.sig, t.queuedAt);
  if (fuses_) noteFencesLocked(seq, t.allreduce != nullptr, std::move(hooks.touches));
  unfinished_.emplace_back(seq, t.done);
  noteFirstUnfinishedLocked();
  t.prepare = std::move(hooks.prepare);
  // A caller that would only wait for the idle engine thread runs its call
  // itself, whatever the path (host segment, network, or a group of one):
  // two thread hand-offs saved.
  if (hooks.callerWaits && engineIdle_ && !runningOnCaller_ && queue_.empty()) {
    runOnCaller(std::move(t), lock);
    return seq;
  }
  queue_.push_back(std::move(t));
  queued_.store(queue_.size(), std::memory_order_release);
  if (fuses_) publishIssuedLocked();  // under queueMu_, before shutdown
  lock.unlock();
  queueCv_.notify_one();
  return seq;
}

void Communicator::awaitSettledLocked(std::unique_lock<std::mutex>& lock) {
  // Not the engine thread itself (a completion callback that calls): it
  // settles only once the callback returns. worker_ is joined only once
  // stopping_ is set.
  if (stopping_ || !engineSettling_ || runningOnCaller_ || !queue_.empty() ||
      std::this_thread::get_id() == worker_.get_id()) {
    return;
  }
  ++settleWaiters_;
  settledCv_.wait_for(lock, kSettleWait, [&] { return !engineSettling_ || stopping_; });
  --settleWaiters_;
}

void Communicator::settledLocked() {
  engineSettling_ = false;
  if (settleWaiters_ > 0) settledCv_.notify_all();
}

void Communicator::noteFencesLocked(uint64_t seq, bool allreduce,
                                    std::vector<MemRange> touches) {
  if (!allreduce) {
    openCalls_.clear();  // no batch spans another collective
    return;
  }
  // Calls already cut into a batch can no longer share one with this
  // call; a batch holds at most kMaxFusedCalls consecutive calls.
  std::erase_if(openCalls_, [&](const OpenCall& c) { return c.seq < cutEnd_; });
  if (openCalls_.size() >= static_cast<size_t>(kMaxFusedCalls)) {
    openCalls_.erase(openCalls_.begin());
  }
  bool overlaps = false;
  for (const OpenCall& c : openCalls_) {
    for (const MemRange& a : c.touches) {
      for (const MemRange& b : touches) overlaps = overlaps || a.overlaps(b);
    }
  }
  if (overlaps) {
    fences_.push_back(seq);
    openCalls_.clear();
  }
  openCalls_.push_back({seq, std::move(touches)});
}

void Communicator::runOnCaller(Task t, std::unique_lock<std::mutex>& lock) {
  // The engine thread is parked (engineIdle_) and stays parked while
  // runningOnCaller_ is set, so this thread has the worker's state to
  // itself; queueMu_ orders the handover both ways.
  runningOnCaller_ = true;
  if (fuses_) publishIssuedLocked();  // the call is issued: peers' cuts may hold it
  lock.unlock();
  std::vector<Task>& tasks = callerTasks_;  // kept: its storage is reused
  tasks.push_back(std::move(t));
  observer_->ranOnCaller();
  {
    CallerWaiting waiting;  // this thread waits for peers: poll before sleeping
    runTasks(tasks, /*onCaller=*/true);  // completes every task it ran, errors included
  }
  tasks.clear();
  lock.lock();
  runningOnCaller_ = false;
  if (ctx_->control().hasPending()) engineKick_ = true;
  // Wake the parked engine thread only if it has something to do (calls
  // queued meanwhile, control frames to retry) or shutdown waits for this
  // call: a futex wake per call, for a thread that goes straight back to
  // sleep, cost about a tenth of a small call.
  const bool wake = stopping_ || engineKick_ || !queue_.empty();
  lock.unlock();
  if (wake) {
    queueCv_.notify_all();
    exitedCv_.notify_all();
  }
}

void Communicator::forgetUnfinishedLocked(uint64_t seq) {
  auto it = std::find_if(unfinished_.begin(), unfinished_.end(),
                         [seq](const auto& u) { return u.first == seq; });
  if (it != unfinished_.end()) unfinished_.erase(it);
  noteFirstUnfinishedLocked();
}

uint64_t Communicator::firstUnfinishedLocked() const {
  // unfinished_ is in call order: push appends, calls only leave it.
  return unfinished_.empty() ? nextSeq_.load() : unfinished_.front().first;
}

void Communicator::noteFirstUnfinishedLocked() {
  // From shutdown on the calls left are dropped, not finished: the rank
  // leaves before the first of them (shutdown records it first).
  if (!stopping_) ctx_->peers().noteFirstUnfinished(firstUnfinishedLocked());
}

void Communicator::publishIssuedLocked() {
  path_->noteIssued(fences_.empty() ? nextSeq_.load() : fences_.front());
}

void Communicator::noteBatchCut(uint64_t next) {
  std::lock_guard<std::mutex> lock(queueMu_);
  noteBatchCutLocked(next);
}

void Communicator::noteBatchCutLocked(uint64_t next) {
  if (next <= cutEnd_) return;
  cutEnd_ = next;
  while (!fences_.empty() && fences_.front() <= next) fences_.pop_front();
  if (!stopping_) publishIssuedLocked();
}

void Communicator::enqueueP2P(std::string what, Body body) {
  std::unique_lock<std::mutex> lock(queueMu_);
  if (stopping_) {
    throwError(ErrorKind::kAborted, "smddp: cannot start " + what + ": the process group '" +
                                        name() + "' was shut down");
  }
  Task t;
  t.what = std::move(what);
  t.body = std::move(body);
  t.p2p = true;
  queue_.push_back(std::move(t));
  queued_.store(queue_.size(), std::memory_order_release);
  lock.unlock();
  queueCv_.notify_one();
}

void Communicator::workerLoop() {
  struct Exited {
    Communicator& c;
    ~Exited() {
      std::lock_guard<std::mutex> lock(c.queueMu_);
      c.workerExited_ = true;
      c.exitedCv_.notify_all();
    }
  } exited{*this};
  // Sleeps between polls are short; the default 50 us timer slack would
  // dominate them.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  if (timeline::on()) timeline::nameThread("engine " + name());
  while (true) {
    Task task;  // one per call: what its body captured goes with it
    if (!waitForTask(&task)) return;
    if (task.p2p) {
      task.body(*ctx_, task.seq);  // posts and returns; completion comes from progress()
      continue;
    }
    std::vector<Task> tasks;
    tasks.push_back(std::move(task));
    runTasks(tasks);
    if (ctx_->p2p().inFlight() > 0) superviseP2P();  // their deadlines pass during collectives too
  }
}

bool Communicator::waitForTask(Task* task) {
  const EngineConfig& config = ctx_->config();
  IdleTicks ticks{kFirstIdleTick, nextSeq_.load()};  // from the end of the engine's last call
  while (true) {
    std::unique_lock<std::mutex> lock(queueMu_);
    if (ctx_->p2p().inFlight() == 0 && !ctx_->control().hasPending() && queue_.empty() &&
        !stopping_) {
      // Calls often come back to back (a benchmark loop, a caller that
      // waits on each call): poll for SMDDP_SPIN_US, yielding, before
      // sleeping, but only while a caller is waiting, not computing.
      // Meanwhile a caller that waits on its call may run it itself.
      engineIdle_ = true;
      settledLocked();  // a waiting caller runs its call itself
      lock.unlock();
      const auto until = std::chrono::steady_clock::now() +
                         std::chrono::microseconds(aCallerIsWaiting() ? config.spinUs : 0);
      while (queued_.load(std::memory_order_acquire) == 0 &&
             std::chrono::steady_clock::now() < until) {
        sched_yield();
      }
      lock.lock();
      parkIdle(lock, ticks);
      engineIdle_ = false;
      engineKick_ = false;
    }
    settledLocked();  // more to do: a waiting caller queues its call
    if (!queue_.empty()) {
      *task = std::move(queue_.front());
      queue_.pop_front();
      queued_.store(queue_.size(), std::memory_order_release);
      return true;
    }
    if (stopping_) return false;
    // Point-to-point operations are in flight, or control frames wait
    // for their peer (postControl): keep them moving.
    lock.unlock();
    if (ctx_->progress() == 0) {
      if (ctx_->p2p().inFlight() > 0) {
        superviseP2P();
        std::this_thread::sleep_for(
            std::chrono::microseconds(std::min<int64_t>(config.sleepUs, 20)));
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(config.sleepUs));
      }
    }
  }
}

void Communicator::parkIdle(std::unique_lock<std::mutex>& lock, IdleTicks& ticks) {
  // A call can end here while the provider still owes a peer bytes of it:
  // rxm's rendezvous acknowledgement is injected (copied, no completion)
  // and tcp writes it only when the socket has room, during some later
  // progress. A rank whose next call on this group waits on that peer
  // elsewhere (another group, Gloo) never makes that progress, and the
  // peer waits out the group timeout (a 3 x 2 cluster with small socket
  // buffers, docs/notes/2026-12-06-idle-progress.md). So the parked engine
  // thread progresses the endpoint, as Gloo's and NCCL's progress threads
  // do: soon after a call, then backing off to kIdleTickCap, and only
  // once no call has started since its last look (each call progresses
  // the endpoint itself; a tick that made a caller queue its call would
  // cost it a thread hand-off).
  const auto ready = [&] {
    return stopping_ || ((!queue_.empty() || engineKick_) && !runningOnCaller_);
  };
  while (!queueCv_.wait_for(lock, ticks.every, ready)) {
    ticks.every = std::min(ticks.every * 2, kIdleTickCap);
    const uint64_t seq = nextSeq_.load();
    if (runningOnCaller_ || endpointHolds_ > 0 || seq != ticks.seenSeq) {
      ticks.seenSeq = seq;
      continue;
    }
    engineIdle_ = false;  // a caller that comes meanwhile waits for the tick
    engineSettling_ = true;
    idleTicking_ = true;
    lock.unlock();
    ticking.fetch_add(1);
    if (!exiting.load()) {
      try {
        ctx_->progress();
      } catch (const std::exception& e) {
        // Whatever broke, the next call meets it and reports it.
        SMDDP_LOG(kDebug) << "idle progress of group '" << name() << "': " << e.what();
      }
    }
    ticking.fetch_sub(1);
    lock.lock();
    engineIdle_ = true;
    settledLocked();
    idleTicking_ = false;
    if (endpointHolds_ > 0) queueCv_.notify_all();  // an EndpointHold waits for this tick
  }
}

Communicator::EndpointHold::EndpointHold(Communicator& comm) : comm_(comm) {
  std::unique_lock<std::mutex> lock(comm_.queueMu_);
  ++comm_.endpointHolds_;
  comm_.queueCv_.wait(lock, [&] { return !comm_.idleTicking_; });
}

Communicator::EndpointHold::~EndpointHold() {
  std::lock_guard<std::mutex> lock(comm_.queueMu_);
  --comm_.endpointHolds_;
}

}  // namespace smddp
