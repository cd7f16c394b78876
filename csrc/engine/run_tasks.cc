// Running one call, or one run of the allreduce path (which may take more
// queued calls into a fusion batch): dispatch, the failure plane (error
// frames, the broken state, the desync report), then completion. What
// each call's life leaves behind (flight recorder, timeline, stats, the
// debug log) is the CallObserver's.
#include <algorithm>

#include "common/error.h"
#include "common/logging.h"
#include "engine/communicator.h"

namespace smddp {

// The queue's side of one run of the allreduce path: the calls the path
// takes join `tasks`, so they complete with the run.
class Communicator::QueuedRun final : public AllreduceBatch {
 public:
  QueuedRun(Communicator& comm, std::vector<Task>& tasks, CallPath path, bool onCaller)
      : AllreduceBatch(*tasks[0].allreduce, onCaller), comm_(comm), tasks_(tasks), path_(path),
        firstSeq_(tasks[0].seq), firstWhat_(tasks[0].what), firstSig_(tasks[0].sig) {}

  Take takeNext(std::chrono::microseconds wait, const Accept& accept,
                AllreduceCall** out) override {
    std::unique_lock<std::mutex> lock(comm_.queueMu_);
    auto& queue = comm_.queue_;
    if (queue.empty() && wait.count() > 0) {
      comm_.queueCv_.wait_for(lock, wait, [&] { return comm_.stopping_ || !queue.empty(); });
    }
    if (comm_.stopping_) {
      throwError(ErrorKind::kAborted,
                 "smddp: " +
                     callAt(comm_.ctx_->name(), callName(firstWhat_, firstSig_), firstSeq_) +
                     ": the process group was shut down");
    }
    if (queue.empty()) return Take::kEmpty;
    Task& next = queue.front();
    if (!next.allreduce || next.p2p || !accept(*next.allreduce)) return Take::kOther;
    *out = next.allreduce.get();
    tasks_.push_back(std::move(next));
    queue.pop_front();
    comm_.queued_.store(queue.size(), std::memory_order_release);
    lock.unlock();
    comm_.observer_->started(tasks_.back().seq, path_, firstSeq_, onCaller(),
                             std::chrono::steady_clock::now());
    // Every call before it has completed or rides in this run, which
    // touches none of its memory (fences_).
    if (tasks_.back().prepare) tasks_.back().prepare();
    return Take::kTaken;
  }

  void visitQueued(const Accept& visit) override {
    std::lock_guard<std::mutex> lock(comm_.queueMu_);
    // A call that overlaps an earlier call the batch could hold is fenced
    // (noteFencesLocked): the visit ends before it.
    auto fence = std::upper_bound(comm_.fences_.begin(), comm_.fences_.end(), firstSeq_);
    const uint64_t fencedFrom = fence == comm_.fences_.end() ? UINT64_MAX : *fence;
    for (const Task& t : comm_.queue_) {
      if (t.p2p || !t.allreduce || t.seq >= fencedFrom || !visit(*t.allreduce)) break;
    }
  }

  void noteCut(uint64_t next) override { comm_.noteBatchCut(next); }

 private:
  Communicator& comm_;
  std::vector<Task>& tasks_;
  const CallPath path_;
  // By value: takeNext appends to tasks_, which moves them.
  const uint64_t firstSeq_;
  const std::string firstWhat_;  // often empty (callName)
  const CollectiveSignature firstSig_;
};

void Communicator::runTasks(std::vector<Task>& tasks, bool onCaller) {
  const auto started = std::chrono::steady_clock::now();
  const CollectiveType type = tasks[0].sig.collective;
  const HostCollectives* host = tasks[0].p2p ? nullptr : path_->hostCollectivesFor(type);
  const CallPath path = tasks[0].allreduce ? path_->callPath()
                        : host             ? host->callPath()
                                           : CallPath::kNetwork;
  observer_->started(tasks[0].seq, path, tasks[0].seq, onCaller, started);
  std::exception_ptr eptr = dispatch(tasks, path, onCaller);
  finishTasks(tasks, path, started, eptr, onCaller);
}

std::exception_ptr Communicator::dispatch(std::vector<Task>& tasks, CallPath path,
                                          bool onCaller) {
  ControlPlane& control = ctx_->control();
  // tasks[0], never a reference to it: a run of the path appends to tasks.
  if (control.broken()) {
    return std::make_exception_ptr(Error(
        ErrorKind::kAborted, "smddp: " + callAt(ctx_->name(), tasks[0].name(), tasks[0].seq) +
                                 " refused: the group is unusable after an earlier failure: " +
                                 control.brokenReason()));
  }
  try {
    if (tasks[0].prepare) tasks[0].prepare();
    if (tasks[0].allreduce) {
      QueuedRun run(*this, tasks, path, onCaller);
      path_->run(run);
    } else {
      tasks[0].body(*ctx_, tasks[0].seq);
    }
    return nullptr;
  } catch (const Error& e) {
    return failRun(e, tasks[0].seq, tasks.size());
  } catch (const std::exception& e) {
    control.broadcastError(tasks[0].seq, e.what(), tasks.size());
    return std::make_exception_ptr(Error(ErrorKind::kInternal, e.what()));
  }
}

std::exception_ptr Communicator::failRun(const Error& e, uint64_t firstSeq, size_t calls) {
  ControlPlane& control = ctx_->control();
  std::exception_ptr eptr = std::current_exception();
  observer_->runFailed();
  std::string msg = e.what();
  // Timeouts and lost peers leave the group unusable (so did a
  // quarantine during this call): every peer is told, so that their
  // next call fails at once with this cause instead of waiting for us.
  const bool breaks = e.kind() == ErrorKind::kTimeout || e.kind() == ErrorKind::kPeerLost ||
                      e.kind() == ErrorKind::kTransport || control.broken();
  if (breaks && !control.broken()) {
    // Where every rank stands, so the message says who is behind.
    std::string full = ctx_->withDesyncReport(e);
    if (full != msg) {
      msg = std::move(full);
      eptr = std::make_exception_ptr(Error(e.kind(), msg));
    }
  }
  if (breaks) control.markBroken(msg);
  if (msg.find("failed on another rank") == std::string::npos) {
    control.broadcastError(firstSeq, msg, calls, breaks);
  }
  return eptr;
}

void Communicator::finishTasks(std::vector<Task>& tasks, CallPath path,
                               std::chrono::steady_clock::time_point started,
                               std::exception_ptr eptr, bool onCaller) {
  {
    std::lock_guard<std::mutex> lock(queueMu_);
    // The completions below wake the callers: the engine thread settles
    // from here until waitForTask.
    if (!onCaller) engineSettling_ = true;
    // The calls ran: a fence behind them is spent even if the batch failed
    // before its cut.
    if (fuses_) noteBatchCutLocked(tasks.back().seq + 1);
    for (const Task& t : tasks) forgetUnfinishedLocked(t.seq);
  }
  std::string why;
  if (eptr) {
    try {
      std::rethrow_exception(eptr);
    } catch (const std::exception& e) {
      why = e.what();
    }
  }
  const CallObserver::Run run{path,
                              tasks[0].allreduce != nullptr && fuses_,
                              tasks[0].seq,
                              static_cast<uint32_t>(tasks.size()),
                              started,
                              std::chrono::steady_clock::now(),
                              eptr ? &why : nullptr};
  for (const Task& t : tasks) observer_->ended(run, t.seq, t.sig, t.what, t.queuedAt);
  observer_->runEnded(run);
  for (Task& t : tasks) {
    try {
      (*t.done)(eptr);
    } catch (const std::exception& e) {
      SMDDP_LOG(kError) << "completion callback of " << t.name() << " threw: " << e.what();
    } catch (...) {
      SMDDP_LOG(kError) << "completion callback of " << t.name() << " threw";
    }
  }
  if (auto held = ctx_->memory().detachHeldMemory()) {
    // Sends of this call are still posted (holdForSend): the completions
    // own the call's buffers, so they are kept, not destroyed, with the
    // scratch buffers; the next call allocates new ones.
    for (Task& t : tasks) {
      if (t.done) held->owners.push_back([keep = std::move(t.done)] {});
    }
  }
}

}  // namespace smddp
