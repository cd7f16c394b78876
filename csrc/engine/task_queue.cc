// The Communicator's queue and worker thread: callers enqueue collectives
// (each gets the group's next sequence number at once), and the one engine
// thread runs them in order, handing allreduce runs to the fusion-buffer
// scheduler, and completes each with its outcome. Split from
// communicator.cc, which sets the group up and owns its endpoint.
#include <sched.h>
#include <sys/prctl.h>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "common/caller_waiting.h"
#include "common/error.h"
#include "common/logging.h"
#include "engine/communicator.h"
#include "hostpath/fusion_scheduler.h"
#include "observe/timeline.h"

namespace smddp {

uint64_t Communicator::enqueue(const CollectiveSignature& sig, std::string what,
                               std::function<void(uint64_t)> body, Done done,
                               std::shared_ptr<FusibleCall> fusible, CallHooks hooks) {
  std::unique_lock<std::mutex> lock(queueMu_);
  if (stopping_) {
    throwError(ErrorKind::kAborted, "smddp: cannot start " + callName(what, sig) +
                                        ": the process group '" +
                                        opts_.name + "' was shut down");
  }
  uint64_t seq = nextSeq_++;
  if (fusible) fusible->seq = seq;
  const auto queuedAt = std::chrono::steady_clock::now();
  if (recorder_) {
    recorder_->queued(seq, sig.collective == CollectiveType::kBarrier ? nullptr : &sig, queuedAt);
  }
  if (fuses()) {
    if (fusible) {
      // Calls already cut into a batch can no longer share one with this
      // call; a batch holds at most kMaxFusedCalls consecutive calls.
      std::erase_if(openCalls_, [&](const OpenCall& c) { return c.seq < cutEnd_; });
      if (openCalls_.size() >= static_cast<size_t>(kMaxFusedCalls)) {
        openCalls_.erase(openCalls_.begin());
      }
      bool overlaps = false;
      for (const OpenCall& c : openCalls_) {
        for (const MemRange& a : c.touches) {
          for (const MemRange& b : hooks.touches) overlaps = overlaps || a.overlaps(b);
        }
      }
      if (overlaps) {
        fences_.push_back(seq);
        openCalls_.clear();
      }
      openCalls_.push_back({seq, std::move(hooks.touches)});
    } else {
      openCalls_.clear();  // no batch spans another collective
    }
  }
  auto completion = std::make_shared<CallDone>(std::move(done));
  unfinished_.emplace_back(seq, completion);
  Task t{seq, std::move(what), std::move(body), std::move(completion), false, nullptr, {}, nullptr};
  t.fusible = std::move(fusible);
  // A caller that would only wait for the idle engine thread runs its call
  // itself, whatever the path (host segment, network, or a group of one):
  // two thread hand-offs saved.
  const bool onCaller = hooks.callerWaits && engineIdle_ && !runningOnCaller_ && queue_.empty();
  t.queuedAt = queuedAt;
  t.prepare = std::move(hooks.prepare);
  t.sig = sig;
  if (timeline::on()) timeline::issued(opts_.name, seq, sig);
  if (onCaller) {
    runOnCaller(std::move(t), lock);
    return seq;
  }
  queue_.push_back(std::move(t));
  queued_.store(queue_.size(), std::memory_order_release);
  if (scheduler_) publishIssuedLocked();  // under queueMu_, before shutdown
  lock.unlock();
  queueCv_.notify_one();
  return seq;
}

void Communicator::runOnCaller(Task t, std::unique_lock<std::mutex>& lock) {
  // The engine thread is parked (engineIdle_) and stays parked while
  // runningOnCaller_ is set, so this thread has the worker's state to
  // itself; queueMu_ orders the handover both ways.
  runningOnCaller_ = true;
  if (scheduler_) publishIssuedLocked();  // the call is issued: peers' cuts may hold it
  lock.unlock();
  std::vector<Task>& tasks = callerTasks_;  // kept: its storage is reused
  tasks.push_back(std::move(t));
  stats_.callerRuns++;
  {
    CallerWaiting waiting;  // this thread waits for peers: poll before sleeping
    runTasks(tasks, /*onCaller=*/true);  // completes every task it ran, errors included
  }
  tasks.clear();
  lock.lock();
  runningOnCaller_ = false;
  if (control_.hasPending()) engineKick_ = true;
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
}

void Communicator::publishIssuedLocked() {
  scheduler_->noteIssued(fences_.empty() ? nextSeq_.load() : fences_.front());
}

void Communicator::noteBatchCut(uint64_t next) {
  std::lock_guard<std::mutex> lock(queueMu_);
  noteBatchCutLocked(next);
}

void Communicator::noteBatchCutLocked(uint64_t next) {
  if (next <= cutEnd_) return;
  cutEnd_ = next;
  while (!fences_.empty() && fences_.front() <= next) fences_.pop_front();
  if (scheduler_ && !stopping_) publishIssuedLocked();
}

void Communicator::enqueueP2P(std::string what, std::function<void(uint64_t)> body) {
  std::unique_lock<std::mutex> lock(queueMu_);
  if (stopping_) {
    throwError(ErrorKind::kAborted, "smddp: cannot start " + what + ": the process group '" +
                                        opts_.name + "' was shut down");
  }
  Task t{0, std::move(what), std::move(body), nullptr, true, nullptr, {}, nullptr};
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
  if (timeline::on()) timeline::nameThread("engine " + opts_.name);
  while (true) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(queueMu_);
      if (p2pInFlight_ == 0 && !control_.hasPending() && queue_.empty() && !stopping_) {
        // Calls often come back to back (a benchmark loop, a caller that
        // waits on each call): poll for SMDDP_SPIN_US, yielding, before
        // sleeping, but only while a caller is waiting, not computing.
        // Meanwhile a caller that waits on its call may run it itself.
        engineIdle_ = true;
        lock.unlock();
        const auto until = std::chrono::steady_clock::now() +
                           std::chrono::microseconds(aCallerIsWaiting() ? config_.spinUs : 0);
        while (queued_.load(std::memory_order_acquire) == 0 &&
               std::chrono::steady_clock::now() < until) {
          sched_yield();
        }
        lock.lock();
        queueCv_.wait(lock, [&] {
          return stopping_ || ((!queue_.empty() || engineKick_) && !runningOnCaller_);
        });
        engineIdle_ = false;
        engineKick_ = false;
      }
      if (queue_.empty()) {
        if (stopping_) return;
        // Point-to-point operations are in flight, or control frames wait
        // for their peer (postControl): keep them moving.
        lock.unlock();
        if (progress() == 0) {
          if (p2pInFlight_ > 0) {
            superviseP2P();
            std::this_thread::sleep_for(
                std::chrono::microseconds(std::min<int64_t>(config_.sleepUs, 20)));
          } else {
            std::this_thread::sleep_for(std::chrono::microseconds(config_.sleepUs));
          }
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

void Communicator::logCompleted(const std::vector<Task>& tasks, std::exception_ptr eptr,
                                std::chrono::steady_clock::time_point started) const {
  const auto now = std::chrono::steady_clock::now();
  auto ms = [](auto d) {
    char b[32];
    snprintf(b, sizeof(b), "%.3f ms", std::chrono::duration<double, std::milli>(d).count());
    return std::string(b);
  };
  std::string outcome = "ok";
  if (eptr) {
    try {
      std::rethrow_exception(eptr);
    } catch (const std::exception& e) {
      outcome = std::string("failed: ") + e.what();
    }
  }
  const bool fused = tasks[0].fusible != nullptr;
  const std::string batch = ", batch of " + std::to_string(tasks.size()) + " call(s) from seq " +
                            std::to_string(tasks[0].seq);
  for (const Task& t : tasks) {
    SMDDP_LOG(kDebug) << "[rank " << opts_.rank << "] group '" << opts_.name << "' seq " << t.seq
                      << " " << t.name() << " via "
                      << (scheduler_ && fused ? "shared memory" + batch
                          : fused             ? "libfabric" + batch
                                              : std::string("libfabric"))
                      << ": queued " << ms(started - t.queuedAt) << ", ran " << ms(now - started)
                      << ", " << outcome;
  }
}

void Communicator::runTasks(std::vector<Task>& tasks, bool onCaller) {
  const auto started = std::chrono::steady_clock::now();
  const CallPath path = !(tasks[0].fusible && scheduler_) ? CallPath::kNetwork
                        : peers_.hostCount() > 1          ? CallPath::kHierarchy
                                                          : CallPath::kSharedMemory;
  if (recorder_) recorder_->started(tasks[0].seq, path, tasks[0].seq, onCaller, started);
  std::exception_ptr eptr;
  // By value: the scheduler's takeNext appends to `tasks`, which moves them.
  const uint64_t firstSeq = tasks[0].seq;
  const std::string firstWhat = tasks[0].what;  // often empty (callName)
  const CollectiveSignature firstSig = tasks[0].sig;
  auto firstName = [&] { return callName(firstWhat, firstSig); };
  if (control_.broken()) {
    eptr = std::make_exception_ptr(Error(
        ErrorKind::kAborted, "smddp: " + firstName() + " at sequence " + std::to_string(firstSeq) +
                                 " refused: the group is unusable after an earlier failure: " +
                                 control_.brokenReason()));
  } else {
    try {
      if (tasks[0].prepare) tasks[0].prepare();
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
            throwError(ErrorKind::kAborted, "smddp: " + firstName() + " at sequence " +
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
          lock.unlock();
          if (recorder_) {
            recorder_->started(tasks.back().seq, path, firstSeq, onCaller,
                               std::chrono::steady_clock::now());
          }
          // Every call before it has completed or rides in this batch,
          // which touches none of its memory (fences_).
          if (tasks.back().prepare) tasks.back().prepare();
          return FusionBufferScheduler::Take::kTaken;
        };
        scheduler_->run(calls, takeNext, onCaller);
      } else if (tasks[0].fusible) {
        runNetworkBatch(tasks, path, onCaller);  // the network-only path fuses too
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
                          e.kind() == ErrorKind::kTransport || control_.broken();
      if (breaks && !control_.broken()) {
        // Where every rank stands, so the message says who is behind.
        std::string full = withDesyncReport(e);
        if (full != msg) {
          msg = std::move(full);
          eptr = std::make_exception_ptr(Error(e.kind(), msg));
        }
      }
      if (breaks) control_.markBroken(msg);
      if (msg.find("failed on another rank") == std::string::npos) {
        control_.broadcastError(firstSeq, msg, tasks.size(), breaks);
      }
    } catch (const std::exception& e) {
      eptr = std::make_exception_ptr(Error(ErrorKind::kInternal, e.what()));
      control_.broadcastError(firstSeq, e.what(), tasks.size());
    }
  }
  if (logThreshold() >= LogLevel::kDebug) logCompleted(tasks, eptr, started);
  {
    std::lock_guard<std::mutex> lock(queueMu_);
    // The calls run: a fence behind them is spent even if the batch failed
    // before its cut.
    if (fuses()) noteBatchCutLocked(tasks.back().seq + 1);
    for (const Task& t : tasks) forgetUnfinishedLocked(t.seq);
  }
  const auto finished = std::chrono::steady_clock::now();
  if (recorder_) {
    std::string why;
    if (eptr) {
      try {
        std::rethrow_exception(eptr);
      } catch (const std::exception& e) {
        why = e.what();
      }
    }
    for (const Task& t : tasks) {
      recorder_->ended(t.seq, eptr ? &why : nullptr, static_cast<uint32_t>(tasks.size()),
                       finished);
    }
    if (eptr) dumpFlightRecord(*recorder_, why);
  }
  {
    // stats()' latency per (collective, size class); SMDDP_TIMELINE's spans.
    const bool batched = tasks[0].fusible && scheduler_;
    for (const Task& t : tasks) {
      stats_.latency.record(static_cast<int>(t.sig.collective),
                            t.sig.numel * elementSize(t.sig.dtype),
                            std::chrono::duration_cast<std::chrono::nanoseconds>(
                                finished - t.queuedAt).count());
      if (timeline::on()) {
        const int64_t end = timeline::toNs(finished);
        if (!batched) timeline::ran(opts_.name, t.seq, t.sig, timeline::toNs(started), end);
        timeline::call(opts_.name, t.seq, t.sig, batched ? "shared-memory" : "libfabric",
                       timeline::toNs(t.queuedAt), end, eptr == nullptr);
      }
    }
  }
  for (Task& t : tasks) {
    stats_.collectives++;
    try {
      (*t.done)(eptr);
    } catch (const std::exception& e) {
      SMDDP_LOG(kError) << "completion callback of " << t.name() << " threw: " << e.what();
    } catch (...) {
      SMDDP_LOG(kError) << "completion callback of " << t.name() << " threw";
    }
  }
  if (callHeld_) {
    // Sends of this call are still posted (holdForSend): the completions
    // own the call's buffers, so they are kept, not destroyed, and the
    // scratch buffers go with them; the next call allocates new ones.
    for (Task& t : tasks) {
      if (t.done) callHeld_->owners.push_back([keep = std::move(t.done)] {});
    }
    callHeld_->scratch.swap(scratch_);
    callHeld_->fusion.swap(fusion_);
    callHeld_.reset();  // the sends hold it now
  }
}

std::string Communicator::withDesyncReport(const Error& e) {
  // Only a timeout asks: a lost peer is named in its error already, and its
  // survivors must fail within moments of noticing (a rank cut off from the
  // store, on a host whose link went down, would wait out the budget).
  if (!desync_ || desyncReported_ || e.kind() != ErrorKind::kTimeout || control_.broken()) {
    return e.what();
  }
  desyncReported_ = true;
  // Long enough for a store round trip to every rank on a loaded host
  // (the answering threads may wait for a core), short next to the
  // timeout that brought us here.
  const auto budget = std::clamp(timeout() / 2, std::chrono::milliseconds(1000),
                                 std::chrono::milliseconds(5000));
  const std::string report =
      desync_->collect(budget, [this](int r) { return peers_.lost(r); }, e.what());
  return std::string(e.what()) + ". Desync report: " + report;
}

}  // namespace smddp
