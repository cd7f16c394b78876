// A Communicator is one process group's engine: a FIFO of collectives and
// the single worker thread that runs them (task_queue.cc), over the
// group's context (engine_context.h: endpoint, peers, control plane, ...).
// Callers enqueue and get a callback; sequence numbers are given at enqueue
// time, so ranks that call collectives in the same order agree. Allreduce
// runs through the AllreducePath the layers above chose (allreduce_path.h);
// every other collective is a Body the algorithms queue (algorithms/
// collective_calls.h). Each call's life is reported to one CallObserver
// (observe/call_observer.h).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "common/error.h"
#include "engine/allreduce_path.h"
#include "engine/call.h"
#include "engine/engine_config.h"
#include "engine/engine_context.h"
#include "engine/formation_laps.h"
#include "observe/call_observer.h"
#include "observe/flight_recorder.h"
#include "observe/stats.h"
#include "transport/bootstrap.h"
#include "transport/frame.h"

namespace smddp {

// What the layers above the engine hand a Communicator: every layer's
// tunables and the factory of its allreduce path. hostpath/
// allreduce_paths.h builds the standard one (standardEngineParts).
struct EngineParts {
  EngineConfig config;
  AllreducePathFactory openAllreducePath;
};

// The public surface: identity and configuration, the collectives, and
// lifecycle and statistics (any thread), plus the group's context for the
// engine's parts and tests.
class Communicator {
 public:
  using Done = std::function<void(std::exception_ptr)>;
  // A queued collective's work, run on the engine thread (or on a caller
  // that waits for it) with the group's context and the call's sequence
  // number. Blocks (bounded by the group timeout) and throws smddp::Error.
  using Body = std::function<void(EngineContext& ctx, uint64_t seq)>;
  using P2PDone = std::function<void(std::exception_ptr, int srcRank)>;

  // Rendezvous through `bootstrap`: pick a provider, open the endpoint,
  // exchange addresses, open the allreduce path. Throws on failure
  // (bounded by opts.timeout).
  Communicator(Bootstrap& bootstrap, CommOptions opts, EngineParts parts);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // --- Identity and configuration (any thread) ---
  int rank() const { return ctx_->rank(); }
  int size() const { return ctx_->size(); }
  const std::string& name() const { return ctx_->name(); }  // for logs and the timeline
  const std::string& provider() const { return ctx_->provider(); }
  const EngineConfig& config() const { return ctx_->config(); }
  // How allreduce runs: through the host segment (throughHostSegment()),
  // fused on the network, or plainly on the network; its servers; and, on
  // the engine thread, the all-gather and reduce-scatter of a group on one
  // host (hostCollectives(); null once released).
  const AllreducePath& allreducePath() const { return *path_; }
  // The paths as chosen at formation, in the set-up log's words: how
  // allreduce runs (AllreducePath::describe()) and how all-gather and
  // reduce-scatter do (HostCollectives::describe(), or the network); kept,
  // so they can be read after the path released its resources.
  struct PathWords {
    std::string allreduce;
    std::string gatherScatter;
  };
  const PathWords& pathWords() const { return pathWords_; }
  // Any thread (c10d's setTimeout); a call already waiting keeps its deadline.
  void setTimeout(std::chrono::milliseconds t) { ctx_->waits().setTimeout(t); }
  uint64_t nextSequence() const { return nextSeq_.load(); }
  // Calls queued or running, not yet finished (a shrink wants none).
  size_t unfinishedCalls() const {
    std::lock_guard<std::mutex> lock(queueMu_);
    return unfinished_.size();
  }
  // "smddp/<nonce>/": where this group instance's keys live in the store.
  const std::string& storePrefix() const { return ctx_->storePrefix(); }
  // How the provider was chosen (SMDDP_FI_PROVIDER, FI_PROVIDER, the layout).
  const std::string& providerReason() const { return ctx_->providerReason(); }
  // Who and where every rank is, and whether it is still alive
  // (peer_table.h): any thread.
  const PeerTable& peers() const { return ctx_->peers(); }

  // --- Collectives (any thread; communicator_calls.cc, p2p.cc) ---
  // Buffers must stay valid until `done` runs. Each returns the sequence
  // number it was given.
  // Calls keep call order: an allreduce that touches memory an earlier
  // queued allreduce touches is never fused with it (it starts a new
  // batch), so it reads that call's result. The buffers of one call must
  // not overlap each other (one call reads all of them before it writes
  // any); the backend issues overlapping tensors as separate calls.
  uint64_t allreduce(std::vector<Buffer> bufs, DataType dtype, ReduceOp op, Done done,
                     CallHooks hooks = {});
  // A blocking allreduce (torch_smddp.all_reduce_, tests, benchmarks): runs
  // on the caller's thread when the engine is idle (CallHooks::callerWaits).
  // `touches`: the caller's memory the call reads and writes (CallHooks).
  void allreduceSync(std::vector<Buffer> bufs, DataType dtype, ReduceOp op,
                     std::vector<MemRange> touches = {});
  // Any other collective: `sig` names it (stats' latency, the timeline,
  // messages), `what` too where the signature does not ("barrier"), and
  // `body` runs it (algorithms/collective_calls.h queues each one).
  uint64_t enqueue(const CollectiveSignature& sig, std::string what, Body body, Done done,
                   CallHooks hooks = {});
  // Point-to-point (p2p.cc). They take no sequence number and never block
  // the queue: they are posted in call order and complete in the
  // background. `srcRank` < 0 receives from any rank; `done` gets the
  // sender's rank. A send's hooks.prepare runs on the worker just before
  // it is posted, after the collectives queued before it completed.
  void send(Buffer buf, DataType dtype, int dst, int32_t tag, P2PDone done,
            CallHooks hooks = {});
  void recv(Buffer buf, DataType dtype, int src, int32_t tag, P2PDone done);

  // --- Lifecycle and statistics (any thread) ---
  // Fails queued work, joins the worker, closes the endpoint. Idempotent;
  // a second caller while the first is at work waits for it to finish.
  // `orderly`: no error ended the group (destroy_process_group, not an
  // abort); with no call left unfinished, rank 0 then lets the peers leave
  // the store before it does (EngineContext::closeLiveness).
  void shutdown(bool orderly = false);
  // After shutdown(): the engine thread was stuck in the provider and still
  // runs, so this object must be leaked, never destroyed.
  bool stuck() const { return stuck_.load(); }
  Stats stats() const { return ctx_->counters().snapshot(); }
  // stats()' latency histograms, and zeroing every counter (any thread).
  std::vector<LatencyHistograms::Cell> latencyStats() const {
    return ctx_->counters().latency.cells();
  }
  void resetStats() { ctx_->counters().reset(); }
  // The group's flight recorder (flight_recorder.h); null with
  // SMDDP_TRACE_BUFFER_SIZE=0.
  std::shared_ptr<const FlightRecorder> flightRecorder() const { return observer_->recorder(); }

  // --- The group's context (engine_context.h), for tests that drive the
  //     endpoint themselves while nothing is queued, under an EndpointHold:
  //     its control plane, progress() and the servers' placement. The
  //     backend reads only the accessors above. ---
  EngineContext& context() { return *ctx_; }
  // While one lives, the parked engine thread leaves the endpoint alone
  // (its idle progress, parkIdle), and the thread that made it may use
  // context() itself, with nothing queued. For tests.
  class EndpointHold {
   public:
    explicit EndpointHold(Communicator& comm);
    ~EndpointHold();
    EndpointHold(const EndpointHold&) = delete;
    EndpointHold& operator=(const EndpointHold&) = delete;

   private:
    Communicator& comm_;
  };

 private:
  std::chrono::milliseconds timeout() const { return ctx_->waits().timeout(); }
  // A call's `done`, run once, by whoever gets there first: the thread
  // that ran the call, or a shutdown that had to give up on it (stuck in
  // the provider). Shared by its task and unfinished_: one allocation.
  struct CallDone {
    explicit CallDone(Done d) : done(std::move(d)) {}
    void operator()(std::exception_ptr e) {
      if (!fired.exchange(true)) done(std::move(e));
    }
    std::atomic<bool> fired{false};
    Done done;
  };
  struct Task {
    uint64_t seq = 0;
    std::string what;  // empty where the signature names the call (callName)
    Body body;         // null for allreduce calls, which run through the path
    std::shared_ptr<CallDone> done;  // null for point-to-point tasks
    bool p2p = false;  // posted at once; completes in the background
    std::shared_ptr<AllreduceCall> allreduce;  // a call for the allreduce path
    std::chrono::steady_clock::time_point queuedAt{};  // for the debug log
    std::function<void()> prepare;             // CallHooks::prepare, or null
    CollectiveSignature sig{};                 // for stats' latency and the timeline
    std::string name() const { return callName(what, sig); }
  };
  // A call in messages: `what`, or, where the caller left it empty (every
  // collective but the barriers: spelled out only if a message needs it),
  // its signature.
  static std::string callName(const std::string& what, const CollectiveSignature& sig) {
    return what.empty() ? sig.describe() : what;
  }
  // A queued allreduce the next batch may still fuse (see fences_).
  struct OpenCall {
    uint64_t seq;
    std::vector<MemRange> touches;
  };
  // The queue's side of one run of the allreduce path (run_tasks.cc).
  class QueuedRun;

  // --- Set-up and teardown (communicator.cc) ---
  // SMDDP_LOG_LEVEL=warn/info, once per group: what shared memory gave up
  // on; hosts, provider, the allreduce path and its geometry.
  void warnShmTrouble(const std::vector<std::string>& trouble) const;
  std::string describeGroup() const;
  // Gives up on a thread stuck in the provider: fails the unfinished calls.
  void abandonStuckCalls();
  // The end of shutdown(), once no thread runs calls: the peers hear that
  // this rank leaves before call `leaveBefore` (UINT64_MAX: nothing said,
  // after a stuck thread), then the path, the context's endpoint, requests
  // and sink go.
  void releaseResources(uint64_t leaveBefore = UINT64_MAX, bool orderly = false);

  // --- The queue (task_queue.cc) ---
  uint64_t push(Task t, CallHooks hooks);
  // Under queueMu_: records the overlap fences a new call sets (see fences_).
  void noteFencesLocked(uint64_t seq, bool allreduce, std::vector<MemRange> touches);
  // Under queueMu_: the issued count the fusion leader may fuse below.
  void publishIssuedLocked();
  void noteBatchCut(uint64_t next);
  void noteBatchCutLocked(uint64_t next);     // noteBatchCut, under queueMu_
  void forgetUnfinishedLocked(uint64_t seq);  // drops a call from unfinished_
  // The first call this rank has not finished (the next one when none is
  // open), and telling the liveness goodbye about it.
  uint64_t firstUnfinishedLocked() const;
  void noteFirstUnfinishedLocked();
  void enqueueP2P(std::string what, Body body);
  void workerLoop();
  // Waits for work; false once the worker must exit. Meanwhile keeps
  // point-to-point operations and control frames moving.
  bool waitForTask(Task* task);
  // The engine thread parked between calls, until ready. At growing
  // intervals (up to kIdleTickCap) it progresses the endpoint, unless a
  // call started since its last look (seenSeq, the next sequence number).
  struct IdleTicks {
    std::chrono::microseconds every;
    uint64_t seenSeq;
  };
  void parkIdle(std::unique_lock<std::mutex>& lock, IdleTicks& ticks);
  // Once per process, before the first engine thread starts: idle
  // progress stops when the process exits.
  static void registerIdleProgressExit();
  static constexpr std::chrono::microseconds kFirstIdleTick{100};
  static constexpr std::chrono::microseconds kIdleTickCap{5000};
  // A caller that would run its call itself, arriving while the engine
  // thread settles (engineSettling_), waits for it to park, for at most
  // kSettleWait; then, or if the engine found more to do, it queues.
  void awaitSettledLocked(std::unique_lock<std::mutex>& lock);
  void settledLocked();
  static constexpr std::chrono::milliseconds kSettleWait{10};
  // Runs `t` on the calling thread (enqueue with callerWaits, under the
  // conditions above); `lock` holds queueMu_ and is released.
  void runOnCaller(Task t, std::unique_lock<std::mutex>& lock);

  // --- Running a call (run_tasks.cc) ---
  // Runs one task (or, for an allreduce, one run of the path, which may
  // take more calls into `tasks`) and completes them all; errors become
  // the tasks' exceptions.
  void runTasks(std::vector<Task>& tasks, bool onCaller = false);
  std::exception_ptr dispatch(std::vector<Task>& tasks, CallPath path, bool onCaller);
  // A failed run: tells the peers (error frames), breaks the group on a
  // timeout or a lost peer (with the desync report); the run's error.
  std::exception_ptr failRun(const Error& e, uint64_t firstSeq, size_t calls);
  // The run ended: fences, observer, completions, held memory.
  void finishTasks(std::vector<Task>& tasks, CallPath path,
                   std::chrono::steady_clock::time_point started, std::exception_ptr eptr,
                   bool onCaller);

  // --- Point-to-point (p2p.cc) ---
  void postP2P(Request* r);
  // Point-to-point deadlines and peer liveness, checked while operations
  // are in flight; a failure there breaks the group (breakP2P).
  void superviseP2P();
  void breakP2P(ErrorKind kind, const std::string& why);

  // Where the set-up's time went (the context's phases, then the path's
  // and the observer's), for describeGroup().
  FormationLaps laps_;
  // Set up by the constructor and released by shutdown; the path holds
  // references into the context, so it goes first (declared after it).
  std::unique_ptr<EngineContext> ctx_;
  // run(): worker thread only; noteIssued: under queueMu_; the rest: any thread.
  std::unique_ptr<AllreducePath> path_;
  PathWords pathWords_;
  bool fuses_ = false;                   // path_->fuses(), fixed at construction
  std::unique_ptr<CallObserver> observer_;  // locks itself where it must
  std::chrono::steady_clock::time_point nextP2PLiveness_{};  // worker thread only

  std::atomic<uint64_t> nextSeq_{0};
  std::mutex shutdownMu_;  // one shutdown at a time (abort from another thread)
  mutable std::mutex queueMu_;
  std::condition_variable queueCv_;
  std::deque<Task> queue_;  // guarded by queueMu_
  // Overlap fences. A batch only fuses calls below every rank's published
  // issued count, so a call that touches memory a call it could be fused
  // with touches is published as not yet issued (a fence) until this rank
  // has cut the batch before it: the call then starts a batch of its own
  // and reads the earlier result, on every rank, whoever overlaps.
  std::vector<OpenCall> openCalls_;  // guarded by queueMu_: since the last fence or cut
  std::deque<uint64_t> fences_;      // guarded by queueMu_: ascending sequences
  uint64_t cutEnd_ = 0;              // guarded by queueMu_: first sequence in no cut batch
  std::atomic<size_t> queued_{0};  // queue_.size(), readable without queueMu_
  bool stopping_ = false;   // guarded by queueMu_
  // Collectives queued or running, by sequence: what a shutdown that gives
  // up on a stuck worker still has to complete.
  // By sequence, in the order queued (calls finish mostly in that order).
  std::vector<std::pair<uint64_t, std::shared_ptr<CallDone>>> unfinished_;  // guarded by queueMu_
  bool workerExited_ = false;            // guarded by queueMu_
  std::condition_variable exitedCv_;     // signals workerExited_
  std::atomic<bool> stuck_{false};
  // The engine thread waits for work with nothing in flight (no task, no
  // point-to-point operation, no pending control frame): a caller that
  // waits on its call may run it itself (CallHooks::callerWaits).
  bool engineIdle_ = false;  // guarded by queueMu_
  // A caller's thread is running a call: the engine thread takes no task
  // meanwhile, and the "worker thread only" state belongs to that caller.
  bool runningOnCaller_ = false;  // guarded by queueMu_
  int endpointHolds_ = 0;         // guarded by queueMu_ (EndpointHold)
  bool idleTicking_ = false;      // guarded by queueMu_: parkIdle is progressing
  // A call run by a caller left control frames to retry: the engine
  // thread must wake up and keep them moving.
  bool engineKick_ = false;  // guarded by queueMu_
  // The engine thread completed its calls (or is in an idle tick) and is
  // on its way back to waitForTask. A caller that queued its call now
  // would keep it busy into that call, and the completion would wake the
  // caller to queue its next one before the engine parks: a convoy of
  // hand-offs, up to 10 of a new group's first 12 calls on two cores,
  // each 1.4x a call run by its caller
  // (docs/notes/2026-12-07-caller-convoy.md). So such a caller waits for
  // the engine to settle (awaitSettledLocked). An engine thread that has
  // not reached waitForTask yet settles too.
  bool engineSettling_ = true;        // guarded by queueMu_
  int settleWaiters_ = 0;             // guarded by queueMu_
  std::condition_variable settledCv_;  // signals the end of engineSettling_
  std::vector<Task> callerTasks_;  // runOnCaller's, while runningOnCaller_
  std::thread worker_;
};

}  // namespace smddp
