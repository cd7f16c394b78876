// A Communicator is one process group's engine: it owns the endpoint, the
// peer table (peer_table.h), the control plane (control_frames.h), a FIFO
// of collectives and the single worker thread that runs them (task_queue.cc).
// Callers enqueue and get a callback; sequence numbers are given at enqueue
// time, so ranks that call collectives in the same order agree.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/dtype.h"
#include "common/error.h"
#include "engine/control_frames.h"
#include "observe/desync.h"
#include "observe/flight_recorder.h"
#include "engine/peer_table.h"
#include "engine/request.h"
#include "server/server_wire.h"
#include "observe/stats.h"
#include "transport/bootstrap.h"
#include "transport/endpoint.h"
#include "transport/frame.h"

namespace smddp {

class FusionBufferScheduler;
struct FusibleCall;
struct CutProposal;

// Standalone reduction servers found in a store (torch_smddp/__init__.py:
// registered by python -m torch_smddp.server --rendezvous), in place of
// SMDDP_SERVER_HOSTS, with the key generated for the job there.
struct RegisteredServers {
  std::vector<ServerAddress> hosts;
  std::string key;  // never logged
};

struct CommOptions {
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{300000};
  std::string name = "default";  // for messages and logs
  std::optional<RegisteredServers> servers;
};

struct Buffer {
  void* data = nullptr;
  uint64_t numel = 0;
};

// Bytes [begin, end) of the caller's memory that a call reads or writes.
struct MemRange {
  uintptr_t begin = 0;
  uintptr_t end = 0;
  bool overlaps(const MemRange& o) const { return begin < o.end && o.begin < end; }
};

// What a caller may add to a call. The torch backend hands the engine
// private staging copies of non-contiguous (or pre-scaled) tensors, so the
// engine cannot see from the buffers alone that two calls touch the same
// storage: `touches` names the caller's memory instead (empty: the
// buffers; only allreduce, which may be fused, looks at it). `prepare`
// runs on the worker thread just before the call's buffers are first
// read, after every earlier call has completed (and run its `done`), so a
// staging copy-in sees the results of the calls before it: call order, for
// every collective and for sends.
// `callerWaits`: the caller blocks on this call as soon as it returns (a
// synchronous call: c10d's async_op=False, allreduceSync). If the engine
// thread is idle and nothing is queued, the call then runs on the caller's
// thread, inside allreduce(), and `done` has run when it returns: no
// handoff to the engine thread and back (docs/design.md, "The allreduce
// path"). It runs exactly as the engine would run it (same plan, same
// checks), so peers cannot tell which thread ran it.
struct CallHooks {
  std::vector<MemRange> touches;
  std::function<void()> prepare;
  bool callerWaits = false;
};

// Tunables read once per communicator from SMDDP_* variables.
struct EngineConfig {
  uint64_t chunkBytes;
  uint64_t minShardBytes;
  int64_t ringDepth;  // 0 (auto) until the Communicator resolves it: 4, or 2 across hosts
  int64_t maxPostedRecvs;
  int64_t spinUs;
  int64_t streamSpinUs;  // polling inside a shared-memory batch's data steps
  int64_t sleepUs;
  bool hostPath;          // allreduce through the host's shared memory segment
  uint64_t fusionBytes;   // fusion buffer budget
  uint64_t shmSlotBytes;  // one pipeline step of one shard
  int64_t shmDepth;       // pipeline steps in flight
  int64_t serversPerNode; // reduction servers per host; 0 = every rank
  uint64_t streamingBytes; // batches this large write results with streaming stores
  uint64_t smallBytes;     // batches up to this size: one step, every rank reduces all parts
  std::vector<ServerAddress> serverHosts;  // standalone reduction servers (SMDDP_SERVER_HOSTS)
  std::string serverJob;                   // SMDDP_SERVER_JOB
  int64_t serverCount = 0;                 // SMDDP_SERVER_COUNT
  std::string serverKey;                   // the key a store handed out (else the key file)
  int serverSharePercent = -1;             // SMDDP_SERVER_SHARE (-1: balanced)
  int64_t serverWaitSeconds = 60;          // SMDDP_SERVER_WAIT
  bool serverRequired = false;             // SMDDP_SERVER_REQUIRED
  static EngineConfig fromEnvironment();
};
// The readers of the parameters each engine file declares next to the code
// that uses them (the NCCL_PARAM pattern); fromEnvironment calls them all.
void readExchangeParams(EngineConfig& c);   // exchange.cc: wire chunking, posted receives
void readAllreduceParams(EngineConfig& c);  // allreduce.cc: network-path shards
void readHostPathParams(EngineConfig& c);   // host_path.cc: segment geometry, fusion size
// host_path.cc: servers a store handed out replace SMDDP_SERVER_HOSTS; then
// the lists must agree with SMDDP_SERVER_COUNT.
void applyRegisteredServers(EngineConfig& c, const std::optional<RegisteredServers>& servers);
void readFusionParams(EngineConfig& c);     // fusion_scheduler.cc: data-step polling, stores

// The public surface has two audiences. The backend (and tests,
// benchmarks) use the first three groups: identity and configuration, the
// collectives, and lifecycle and statistics. The engine's own parts
// (Exchange, the algorithms, the fusion scheduler) also use the last
// group, from the worker thread: the group's peers, control plane and
// request pool, each owned by a class of its own, and the call's memory.
class Communicator {
 public:
  using Done = std::function<void(std::exception_ptr)>;

  // Rendezvous through `bootstrap`: pick a provider, open the endpoint,
  // exchange addresses. Throws on failure (bounded by opts.timeout).
  Communicator(Bootstrap& bootstrap, CommOptions opts);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // --- Identity and configuration (any thread) ---
  int rank() const { return opts_.rank; }
  int size() const { return opts_.size; }
  const std::string& name() const { return opts_.name; }  // the group's, for logs and the timeline
  const std::string& provider() const { return provider_; }
  const std::string& providerReason() const { return providerReason_; }
  // True when allreduce runs through the fusion-buffer scheduler over the
  // host's shared memory (every rank on one host).
  bool usesHostPath() const { return scheduler_ != nullptr; }
  // True when allreduce runs over libfabric only and still fuses queued
  // calls (network_fusion.h): SMDDP_FUSION_BUFFER_BYTES > 0, several ranks.
  bool fusesOnNetwork() const { return netFusion_; }
  int reductionServers() const;
  // Standalone reduction servers the group shards over (those it reached).
  int standaloneServers() const;
  // The ranks that run reduction servers on the network path, ascending
  // (server index i is rank networkServers()[i]).
  const std::vector<int>& networkServers() const { return netServers_; }
  const EngineConfig& config() const { return config_; }
  // The group timeout. Any thread may change it (c10d's setTimeout) while
  // the worker reads it, hence the atomic; a call already waiting keeps the
  // deadline it started with.
  std::chrono::milliseconds timeout() const {
    return std::chrono::milliseconds(timeoutMs_.load(std::memory_order_relaxed));
  }
  void setTimeout(std::chrono::milliseconds t) {
    timeoutMs_.store(t.count(), std::memory_order_relaxed);
  }
  uint64_t nextSequence() const { return nextSeq_.load(); }
  // "smddp/<nonce>/": where this group instance's keys live in the store.
  const std::string& storePrefix() const { return storePrefix_; }

  // --- Collectives (any thread; collective_calls.cc, p2p.cc) ---
  // Buffers must stay valid until `done` runs. Each returns the sequence
  // number it was given.
  // Calls keep call order: an allreduce that touches memory an earlier
  // queued allreduce touches is never fused with it (it starts a new
  // batch), so it reads that call's result. The buffers of one call must
  // not overlap each other (one call reads all of them before it writes
  // any); the backend issues overlapping tensors as separate calls.
  uint64_t allreduce(std::vector<Buffer> bufs, DataType dtype, ReduceOp op, Done done,
                     CallHooks hooks = {});
  uint64_t broadcast(std::vector<Buffer> bufs, DataType dtype, int root, Done done,
                     CallHooks hooks = {});
  // outs[r] receives rank r's `in`; outs[rank] may alias `in`.
  uint64_t allgather(Buffer in, std::vector<Buffer> outs, DataType dtype, Done done,
                     CallHooks hooks = {});
  uint64_t barrier(Done done);
  uint64_t reduceScatter(std::vector<Buffer> ins, Buffer out, DataType dtype, ReduceOp op,
                         Done done, CallHooks hooks = {});
  uint64_t reduce(Buffer buf, DataType dtype, ReduceOp op, int root, Done done,
                  CallHooks hooks = {});
  uint64_t gather(Buffer in, std::vector<Buffer> outs, DataType dtype, int root, Done done,
                  CallHooks hooks = {});
  uint64_t scatter(std::vector<Buffer> ins, Buffer out, DataType dtype, int root, Done done,
                   CallHooks hooks = {});
  uint64_t alltoall(std::vector<Buffer> ins, std::vector<Buffer> outs, DataType dtype, Done done,
                    CallHooks hooks = {});
  // Point-to-point (p2p.cc). They take no sequence number and never block
  // the queue: they are posted in call order and complete in the
  // background. `srcRank` < 0 receives from any rank; `done` gets the
  // sender's rank. A send's hooks.prepare runs on the worker just before
  // it is posted, after the collectives queued before it completed.
  using P2PDone = std::function<void(std::exception_ptr, int srcRank)>;
  void send(Buffer buf, DataType dtype, int dst, int32_t tag, P2PDone done,
            CallHooks hooks = {});
  void recv(Buffer buf, DataType dtype, int src, int32_t tag, P2PDone done);
  // A barrier whose server is rank 0, so a timeout names every missing rank.
  uint64_t monitoredBarrier(std::chrono::milliseconds timeout, Done done);
  // A blocking allreduce (torch_smddp.all_reduce_, tests, benchmarks): runs
  // on the caller's thread when the engine is idle (CallHooks::callerWaits).
  // `touches`: the caller's memory the call reads and writes (CallHooks).
  void allreduceSync(std::vector<Buffer> bufs, DataType dtype, ReduceOp op,
                     std::vector<MemRange> touches = {});

  // --- Lifecycle and statistics (any thread) ---
  // Fails queued work, joins the worker, closes the endpoint. Idempotent.
  void shutdown();
  // Set once shutdown() starts: long waits give up.
  bool stopRequested() const { return stopRequested_.load(); }
  // After shutdown(): the engine thread was stuck in the provider and still
  // runs, so this object must be leaked, never destroyed.
  bool stuck() const { return stuck_.load(); }
  Stats stats() const { return stats_.snapshot(); }
  // The group's flight recorder (flight_recorder.h); null with
  // SMDDP_TRACE_BUFFER_SIZE=0.
  std::shared_ptr<const FlightRecorder> flightRecorder() const { return recorder_; }

  // --- The engine's parts (worker thread only, or a caller running its
  //     own call: runOnCaller) ---
  // Host topology and liveness: who and where every rank is, its fabric
  // address, and whether it is still alive (peer_table.h). Any thread
  // once constructed; its monitor() is thread-safe.
  const PeerTable& peers() const { return peers_; }
  // Error frames, stall probes and the group's broken state (control_frames.h).
  ControlPlane& control() { return control_; }
  // Every posted Request, until its completion (request.h).
  RequestPool& requests() { return requests_; }
  Endpoint& endpoint() { return *endpoint_; }
  uint64_t jobSecret() const { return jobSecret_; }
  StatsCounters& counters() { return stats_; }
  // Reads completions and dispatches them; returns how many were read.
  size_t progress();
  // The endpoint may still write into memory that was handed back (a
  // receive whose cancellation was never confirmed): stop polling it for
  // good, fail the point-to-point operations in flight and mark the group
  // unusable with `why`. Nothing progresses the endpoint afterwards, not
  // even a close: shutdown leaves it open (releaseResources).
  void quarantine(const std::string& why);
  // The message of `e` with the desync report added (desync.h) when `e` is
  // a timeout that breaks the group here first; else e.what(). Asks every
  // rank through the store, within half the timeout (1 to 5 s).
  std::string withDesyncReport(const Error& e);
  // This rank has cut a fusion batch ending below `next` (the next batch
  // starts there): overlap fences at or below it are spent (task_queue.cc).
  void noteBatchCut(uint64_t next);
  // The running call's memory. Scratch memory is reused across
  // collectives. A send of the running call that is still posted although
  // the call gave up on it (Exchange::abandonOutstanding) holds the call's
  // memory (its completions, once run, and the scratch buffers) until the
  // send completes (holdForSend).
  uint8_t* scratch(size_t bytes);
  uint8_t* fusionBuffer(size_t bytes);
  void holdForSend(Request* r);
  // Every receive ends in this iov: a peer that sends more than expected
  // (a mismatched call) spills here instead of truncating, so the frame's
  // header can still be read and reported. Virtual memory, never touched
  // by a well-behaved job.
  iovec overflowSink() const { return {sink_.base, kSinkBytes}; }
  static constexpr size_t kSinkBytes = 1ull << 30;

 private:
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
    uint64_t seq;
    std::string what;  // empty where the signature names the call (callName)
    std::function<void(uint64_t seq)> body;
    std::shared_ptr<CallDone> done;  // null for point-to-point tasks
    bool p2p = false;  // posted at once; completes in the background
    std::shared_ptr<FusibleCall> fusible;  // an allreduce the scheduler may fuse
    std::chrono::steady_clock::time_point queuedAt{};  // for the debug log
    std::function<void()> prepare;         // CallHooks::prepare, or null
    CollectiveSignature sig{};             // for stats' latency and the timeline
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

  // The end of shutdown(), once the worker has exited: the scheduler,
  // point-to-point operations, endpoint, requests and sink.
  void releaseResources();
  uint64_t enqueue(const CollectiveSignature& sig, std::string what,
                   std::function<void(uint64_t)> body, Done done,
                   std::shared_ptr<FusibleCall> fusible = nullptr, CallHooks hooks = {});
  // Under queueMu_: the issued count the fusion leader may fuse below.
  void publishIssuedLocked();
  void noteBatchCutLocked(uint64_t next);  // noteBatchCut, under queueMu_
  void forgetUnfinishedLocked(uint64_t seq);  // drops a call from unfinished_
  // Runs one task (or, for a fusible allreduce, one fusion batch) and
  // completes it; errors become the tasks' exceptions.
  void runTasks(std::vector<Task>& tasks, bool onCaller = false);
  // Queued allreduces may be fused: through the host segment's scheduler,
  // or on the network-only path (netFusion_).
  bool fuses() const { return scheduler_ != nullptr || netFusion_; }
  // Network-only fusion (network_fusion.cc): what this rank could fuse
  // from `first` on (under queueMu_), and the batch that starts at
  // tasks[0], whose other calls it appends to `tasks`.
  CutProposal proposeCut(const FusibleCall& first);
  void runNetworkBatch(std::vector<Task>& tasks, CallPath path, bool onCaller);

  // SMDDP_LOG_LEVEL=debug: one line per finished call (sequence, size,
  // path, time queued and running, outcome).
  void logCompleted(const std::vector<Task>& tasks, std::exception_ptr eptr,
                    std::chrono::steady_clock::time_point started) const;
  // SMDDP_LOG_LEVEL=info, once per group: hosts, provider, the allreduce
  // path and its geometry, and why that path.
  std::string describeGroup() const;
  void enqueueP2P(std::string what, std::function<void(uint64_t)> body);
  void workerLoop();
  void postP2P(Request* r);
  // Point-to-point deadlines and peer liveness, checked while operations
  // are in flight; a failure there breaks the group (breakP2P).
  void superviseP2P();
  void breakP2P(ErrorKind kind, const std::string& why);
  // Completes every point-to-point operation in flight with `why`; their
  // requests stay pooled until the endpoint's completion or close.
  void failP2P(const std::string& why, bool timedOut);

  size_t p2pInFlight_ = 0;  // worker thread only
  bool progressing_ = false;  // inside progress(): worker thread only
  bool quarantined_ = false;  // never poll the endpoint again: worker thread only
  // What the running call's unconfirmed sends hold (holdForSend); runTasks
  // fills it once the call's completions ran. Worker thread only.
  std::shared_ptr<HeldMemory> callHeld_;
  std::chrono::steady_clock::time_point nextP2PLiveness_{};  // worker thread only

  CommOptions opts_;  // opts_.timeout is the initial value only: see timeoutMs_
  std::atomic<int64_t> timeoutMs_;
  EngineConfig config_;
  std::string provider_;
  std::string providerReason_;
  uint64_t jobSecret_ = 0;
  std::string storePrefix_;
  std::vector<int> netServers_;
  std::string networkOnlyReason_;  // why openHostPath left allreduce to the network
  std::shared_ptr<Fabric> fabric_;
  std::unique_ptr<Endpoint> endpoint_;

  RequestPool requests_;  // worker thread only
  std::vector<uint8_t> scratch_;  // worker thread only
  std::vector<uint8_t> fusion_;   // worker thread only
  // The overflow sink's reservation, unmapped by its destructor too, so a
  // constructor that throws after reserving it leaks nothing.
  struct Sink {
    void* base = nullptr;
    void reserve();
    void release();
    ~Sink() { release(); }
  };
  Sink sink_;
  // Set up by the constructor; shutdown closes its monitor and locks
  // (releaseResources), this rank's owner lock goes with the object.
  PeerTable peers_;

  std::atomic<uint64_t> nextSeq_{0};
  std::atomic<bool> stopRequested_{false};
  std::mutex queueMu_;
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
  // A call run by a caller left control frames to retry: the engine
  // thread must wake up and keep them moving.
  bool engineKick_ = false;  // guarded by queueMu_
  // Runs `t` on the calling thread (enqueue with callerWaits, under the
  // conditions above); `lock` holds queueMu_ and is released.
  void runOnCaller(Task t, std::unique_lock<std::mutex>& lock);
  std::vector<Task> callerTasks_;  // runOnCaller's, while runningOnCaller_
  std::thread worker_;
  StatsCounters stats_;
  // The control plane's view of this engine: progress() and the state
  // that says whether waiting for a peer is still allowed.
  struct ControlEngine final : ControlPlane::Engine {
    explicit ControlEngine(Communicator& c) : comm(c) {}
    size_t progress() override { return comm.progress(); }
    bool inProgress() const override { return comm.progressing_; }
    bool pollingStopped() const override { return comm.quarantined_ || comm.stopRequested(); }
    std::chrono::milliseconds timeout() const override { return comm.timeout(); }
    Communicator& comm;
  };
  ControlEngine controlEngine_{*this};
  // Error frames, probes, broken state: worker thread only.
  ControlPlane control_{controlEngine_, peers_, requests_, stats_};
  std::unique_ptr<FusionBufferScheduler> scheduler_;  // worker thread only (after construction)
  bool netFusion_ = false;   // set once by the constructor: fusesOnNetwork()
  uint64_t netBatches_ = 0;  // network fusion batches run: worker thread only
  std::shared_ptr<FlightRecorder> recorder_;  // null when SMDDP_TRACE_BUFFER_SIZE=0; locks itself
  std::unique_ptr<DesyncResponder> desync_;   // null without a recorder or a clonable store
  bool desyncReported_ = false;               // worker thread only
};

}  // namespace smddp
