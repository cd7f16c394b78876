// The fusion batch observer (batch_observer.h): the batch's counters and
// its timeline spans.
#include "observe/batch_observer.h"

namespace smddp {

int64_t BatchObserver::recordPhase(Phase p, uint64_t index, uint64_t firstStep, uint64_t endStep,
                                   uint64_t bytes, int64_t beginNs) const {
  const int64_t now = timeline::nowNs();
  timeline::phase(p, group_, index, firstStep, endStep, bytes, beginNs, now);
  return now;
}

void BatchObserver::batch(uint64_t index, uint64_t firstSeq, uint32_t calls, uint64_t bytes,
                          bool small, int64_t beginNs) const {
  stats_.fusionFlushes++;
  stats_.fusionBytes += bytes;
  stats_.fusedCalls += calls;
  if (timeline::on()) {
    timeline::batch(group_, index, firstSeq, calls, bytes, small, beginNs, timeline::nowNs());
  }
}

}  // namespace smddp
