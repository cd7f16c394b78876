// What a fusion batch's run shows: its span and its phases' spans on the
// SMDDP_TIMELINE track of the thread that runs it (the plan wait, copies
// in, combines, copies out), and what stats() counts of fusion batches and
// their data steps; no counter of theirs is changed elsewhere. The call
// observer (call_observer.h) sees each call; this one sees the batch, from
// inside the allreduce path that runs it. The engine context holds one
// per group: the paths are built from the context, before the call
// observer exists.
//
// With SMDDP_TIMELINE unset, every hook is one predictable branch
// (timeline.h) and allocates nothing: the clock is read only while the
// timeline records.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "observe/stats.h"
#include "observe/timeline.h"

namespace smddp {

class BatchObserver {
 public:
  using Phase = timeline::Phase;

  // `stats` outlives the observer.
  BatchObserver(std::string group, StatsCounters& stats)
      : group_(std::move(group)), stats_(stats) {}
  BatchObserver(const BatchObserver&) = delete;
  BatchObserver& operator=(const BatchObserver&) = delete;

  // Where a span begins: now while the timeline records, else 0 (no clock
  // read).
  static int64_t begin() { return timeline::on() ? timeline::nowNs() : 0; }

  // Steps [firstStep, endStep) of batch `index` went through phase `p`
  // (kCut: the plan wait before them), from `beginNs` to now. Returns
  // now, where a phase that follows at once begins (0 when not recording).
  int64_t phase(Phase p, uint64_t index, uint64_t firstStep, uint64_t endStep, uint64_t bytes,
                int64_t beginNs) const {
    return timeline::on() ? recordPhase(p, index, firstStep, endStep, bytes, beginNs) : 0;
  }

  // Batch `index` ran `calls` calls from `firstSeq`, `bytes` in all, from
  // `beginNs` to now: stats()' fusion counters and the batch's span.
  void batch(uint64_t index, uint64_t firstSeq, uint32_t calls, uint64_t bytes, bool small,
             int64_t beginNs) const;

  // One run of consecutive steps of a phase, as a loop moves `cursor` (the
  // next step of the phase): when the span goes, the steps from the
  // cursor's first value to its last, if there were any. A span that goes
  // in an exception shows the steps that were done.
  class PhaseSpan {
   public:
    PhaseSpan(const BatchObserver& observer, Phase p, uint64_t index, const uint64_t& cursor)
        : observer_(observer), phase_(p), index_(index), cursor_(cursor), first_(cursor),
          beginNs_(begin()) {}
    ~PhaseSpan() {
      if (__builtin_expect(beginNs_ != 0, 0) && cursor_ > first_) {
        observer_.phase(phase_, index_, first_, cursor_, 0, beginNs_);
      }
    }
    PhaseSpan(const PhaseSpan&) = delete;
    PhaseSpan& operator=(const PhaseSpan&) = delete;

   private:
    const BatchObserver& observer_;
    const Phase phase_;
    const uint64_t index_;
    const uint64_t& cursor_;
    const uint64_t first_;
    const int64_t beginNs_;  // 0: not recording
  };
  PhaseSpan steps(Phase p, uint64_t index, const uint64_t& cursor) const {
    return PhaseSpan(*this, p, index, cursor);
  }

  // --- stats()' counters of the data steps (atomics, one add each) ---
  // Bytes this rank copied into another rank's slot, or out of another
  // rank's result.
  void sentOnHost(uint64_t bytes) const { stats_.bytesSent += bytes; }
  void receivedOnHost(uint64_t bytes) const { stats_.bytesReceived += bytes; }
  // Steps copied in and not yet out; stats() keeps the most seen.
  void stepsInFlight(uint64_t steps) const {
    if (steps > stats_.chunksInFlightMax.load()) stats_.chunksInFlightMax = steps;
  }
  // A small batch of `bytes` ran: every byte went to and came from each of
  // `peers` ranks.
  void smallBatch(uint64_t bytes, int peers) const {
    stats_.smallBatches++;
    stats_.bytesSent += bytes * peers;
    stats_.bytesReceived += bytes * peers;
  }
  // A cross-host step that used standalone reduction servers finished;
  // `bytes` were posted to one of them.
  void standaloneStep() const { stats_.standaloneServerSteps++; }
  void sentToStandalone(uint64_t bytes) const { stats_.standaloneServerBytes += bytes; }
  // One call's buffers, `bytes` in all, went through a fusion buffer
  // together (the network path's multi-tensor allreduce).
  void buffersFused(uint64_t bytes) const {
    stats_.fusionFlushes++;
    stats_.fusionBytes += bytes;
  }

 private:
  int64_t recordPhase(Phase p, uint64_t index, uint64_t firstStep, uint64_t endStep,
                      uint64_t bytes, int64_t beginNs) const;

  const std::string group_;
  StatsCounters& stats_;  // atomics
};

}  // namespace smddp
