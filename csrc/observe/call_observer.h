// One observer of each call's life in a group: the flight recorder, the
// SMDDP_TIMELINE spans, stats()' call count and latency, and the debug log
// (SMDDP_LOG_LEVEL=debug). The engine reports when a call is queued, when
// it starts, and when its run (the call alone, or a fusion batch) ends;
// what each record keeps is decided here, so the engine only dispatches.
// A fusion batch's own spans (the batch, its plan wait and data steps) and
// stats()' fusion counters are its BatchObserver's (batch_observer.h),
// which the engine context holds for the allreduce path that runs it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "observe/flight_recorder.h"
#include "observe/stats.h"
#include "transport/frame.h"

namespace smddp {

class CallObserver {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  // Opens the flight recorder unless SMDDP_TRACE_BUFFER_SIZE=0. `stats`
  // outlives the observer.
  CallObserver(std::string group, int rank, int size, StatsCounters& stats);

  // The group's flight recorder (it locks itself); null with
  // SMDDP_TRACE_BUFFER_SIZE=0.
  const std::shared_ptr<FlightRecorder>& recorder() const { return recorder_; }

  // Under the queue's lock, on the caller's thread: the call got `seq`.
  void queued(uint64_t seq, const CollectiveSignature& sig, TimePoint at);
  // The call starts, alone or in the fusion batch that starts at `batchFirst`.
  void started(uint64_t seq, CallPath path, uint64_t batchFirst, bool onCaller, TimePoint at);
  // A queued call that never ran (shutdown).
  void notRun(uint64_t seq, const std::string& why);
  // stats()' calls_run_by_caller: a call runs on its caller's thread
  // (CallHooks::callerWaits, the engine thread parked).
  void ranOnCaller() { stats_.callerRuns.fetch_add(1, std::memory_order_relaxed); }
  // stats()' direct_calls: a synchronous allreduce that skipped c10d's
  // Work (Communicator::allreduceSync).
  void direct() { stats_.directCalls.fetch_add(1, std::memory_order_relaxed); }
  // stats()' errors: a run failed in the engine (not a call refused by a
  // group already unusable).
  void runFailed() { stats_.errors.fetch_add(1, std::memory_order_relaxed); }

  // One run of the engine: a call, or the calls of a fusion batch.
  struct Run {
    CallPath path;
    bool fused;  // a run of a fusing allreduce path (a batch, maybe of one call)
    uint64_t firstSeq;
    uint32_t calls;
    TimePoint started;
    TimePoint finished;
    const std::string* error;  // null when the run succeeded
  };
  // Each call of the run ended (`what`: its name, or empty where the
  // signature names it).
  void ended(const Run& run, uint64_t seq, const CollectiveSignature& sig,
             const std::string& what, TimePoint queuedAt);
  // After the run's calls: a failed run dumps the flight record.
  void runEnded(const Run& run);

 private:
  void logEnded(const Run& run, uint64_t seq, const CollectiveSignature& sig,
                const std::string& what, TimePoint queuedAt) const;

  const std::string group_;
  const int rank_;
  StatsCounters& stats_;  // atomics
  std::shared_ptr<FlightRecorder> recorder_;
};

}  // namespace smddp
