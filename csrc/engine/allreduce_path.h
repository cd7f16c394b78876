// The seam between the engine's queue and the ways an allreduce can run.
// The Communicator queues allreduce calls and hands each run of them to one
// AllreducePath, which it holds without knowing which it is: the host's
// shared-memory segment with its fusion scheduler (hostpath/
// fusion_scheduler.h), fusion on the network-only path (hostpath/
// network_fusion.h) or the plain network allreduce (algorithms/
// allreduce.cc). The layers above the engine choose and build the path
// (hostpath/allreduce_paths.h: openAllreducePath), so the engine depends
// on none of them.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "engine/call.h"
#include "observe/flight_recorder.h"
#include "transport/bootstrap.h"
#include "transport/frame.h"

namespace smddp {

class EngineContext;

// At most this many consecutive calls ride in one fusion batch (the plan's
// and the cut proposal's size; the queue's overlap fences look this far).
constexpr int kMaxFusedCalls = 256;

// One queued allreduce.
struct AllreduceCall {
  uint64_t seq = 0;
  std::vector<Buffer> bufs;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  uint64_t numel = 0;
  CollectiveSignature signature() const {
    return CollectiveSignature{CollectiveType::kAllreduce, dtype, op, numel, -1};
  }
};

// One run of the allreduce path as the engine's queue hands it over: the
// first call, already taken from the queue, and the queued allreduce calls
// a fusing path may add to it. Lives for one AllreducePath::run; worker
// thread (or the caller running its own call).
class AllreduceBatch {
 public:
  enum class Take { kTaken, kEmpty, kOther };
  using Accept = std::function<bool(const AllreduceCall&)>;

  AllreduceCall& first() { return *first_; }
  // The calling thread is the caller of first() (it runs its own call and
  // reads the result next).
  bool onCaller() const { return onCaller_; }
  // Takes the next queued call into this run if it is an allreduce and
  // `accept` agrees, waiting up to `wait` for one to be queued; its
  // CallHooks::prepare has run when it is handed out. Throws kAborted
  // when the group shuts down.
  virtual Take takeNext(std::chrono::microseconds wait, const Accept& accept,
                        AllreduceCall** out) = 0;
  // Visits the allreduce calls queued right behind first(), in order,
  // up to the next call that is not one or the next overlap fence, while
  // `visit` returns true (under the queue's lock: keep it short).
  virtual void visitQueued(const Accept& visit) = 0;
  // This rank has cut a batch ending below `next` (the next batch starts
  // there): the queue's overlap fences at or below it are spent.
  virtual void noteCut(uint64_t next) = 0;

 protected:
  AllreduceBatch(AllreduceCall& first, bool onCaller) : first_(&first), onCaller_(onCaller) {}
  ~AllreduceBatch() = default;

 private:
  AllreduceCall* first_;
  bool onCaller_;
};

// Who issued the group's recent collectives last (hostpath/arrivals.h):
// over the last `calls` of at most `window` collectives, per rank how often
// it was the last to issue one and the wait that alone caused (its issue
// time minus the one before it). Empty where the path cannot tell.
struct StragglerRow {
  int rank = 0;
  uint64_t last = 0;
  int64_t causedNs = 0;
};
struct Stragglers {
  uint64_t calls = 0;
  uint64_t window = 0;
  std::vector<StragglerRow> rows;  // one per rank it covers
};

// All-gather and reduce-scatter through the hosts' shared-memory segments
// (hostpath/host_collectives.h): on one host without the network, across
// hosts in a hierarchy. Every rank of a group has one, or none.
class HostCollectives {
 public:
  virtual ~HostCollectives() = default;
  // outs[r] receives rank r's `in`; outs[rank] may be `in` itself.
  virtual void allGather(EngineContext& ctx, uint64_t seq, Buffer in,
                         const std::vector<Buffer>& outs, DataType dtype) = 0;
  // ins[r] is the block destined for rank r; `out` receives this rank's
  // reduced block, combined in rank order; `out` may be ins[rank] itself.
  virtual void reduceScatter(EngineContext& ctx, uint64_t seq, const std::vector<Buffer>& ins,
                             Buffer out, DataType dtype, ReduceOp op) = 0;
  // For stats and the group's description, in a few words.
  virtual std::string describe() const = 0;
  // How its calls run, for the flight recorder, the timeline and the log.
  virtual CallPath callPath() const = 0;
};

class AllreducePath {
 public:
  virtual ~AllreducePath() = default;
  // Whether queued calls may be fused: the queue then keeps overlap fences
  // and hands runs through takeNext.
  virtual bool fuses() const = 0;
  // How its calls run, for the flight recorder, the timeline and the log.
  virtual CallPath callPath() const = 0;
  // Runs batch.first() and whatever it fuses with. Throws smddp::Error;
  // the whole run then fails.
  virtual void run(AllreduceBatch& batch) = 0;
  // The caller has issued every collective below `next` (any thread, under
  // the queue's lock): a fusion leader may cut below it.
  virtual void noteIssued(uint64_t next) {}
  // For the group's description: how allreduce runs, its geometry and why.
  virtual std::string describe() const = 0;
  virtual int reductionServers() const = 0;
  // Straggler attribution; only the host segment's path can tell (its
  // ranks share a clock), and only for the ranks of this host.
  virtual Stragglers stragglers() const { return {}; }
  // Standalone reduction servers it shards over (those it reached).
  virtual int standaloneServers() const { return 0; }
  // Shutdown, once no thread runs calls: gives back what the path holds
  // (the host segment, the standalone servers' links). Only the queries
  // above stay usable.
  virtual void release() {}
  // All-gather and reduce-scatter through the host segment, or null: they
  // then go over the network (algorithms/all_gather.cc, reduce_scatter.cc).
  virtual HostCollectives* hostCollectives() const { return nullptr; }
  // What serves a collective call of `type` through the host segment, or
  // null: the one rule the calls and the flight recorder's path both read.
  HostCollectives* hostCollectivesFor(CollectiveType type) const {
    const bool served = type == CollectiveType::kAllgather || type == CollectiveType::kReduceScatter;
    return served ? hostCollectives() : nullptr;
  }

  // Allreduce goes through the host's shared-memory segment.
  bool throughHostSegment() const { return callPath() != CallPath::kNetwork; }
};

// Builds the group's allreduce path once its endpoint and peers exist
// (collective over `bootstrap`, the group's key space). `shmTrouble` gets
// what went wrong with shared memory, for the group's one warning.
using AllreducePathFactory = std::function<std::unique_ptr<AllreducePath>(
    EngineContext& ctx, Bootstrap& bootstrap, std::vector<std::string>& shmTrouble)>;

}  // namespace smddp
