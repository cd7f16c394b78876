// The call observer (call_observer.h): one place that turns a call's life
// into the flight recorder's entries, the timeline's spans, stats() and
// the debug log.
#include "observe/call_observer.h"

#include <cstdio>

#include "common/dtype.h"
#include "common/logging.h"
#include "observe/timeline.h"
#include "observe/torch_fr.h"

namespace smddp {

CallObserver::CallObserver(std::string group, int rank, int size, StatsCounters& stats)
    : group_(std::move(group)), rank_(rank), stats_(stats) {
  if (const int64_t ring = traceBufferSize(); ring > 0) {
    recorder_ = std::make_shared<FlightRecorder>(group_, rank, size, static_cast<size_t>(ring));
    registerRecorder(recorder_);  // torch-format dumps cover every live group
  }
}

void CallObserver::queued(uint64_t seq, const CollectiveSignature& sig, TimePoint at) {
  // A barrier's entry names no signature (it has no payload to describe).
  if (recorder_) {
    recorder_->queued(seq, sig.collective == CollectiveType::kBarrier ? nullptr : &sig, at);
  }
  if (timeline::on()) timeline::issued(group_, seq, sig);
}

void CallObserver::started(uint64_t seq, CallPath path, uint64_t batchFirst, bool onCaller,
                           TimePoint at) {
  if (recorder_) recorder_->started(seq, path, batchFirst, onCaller, at);
}

void CallObserver::notRun(uint64_t seq, const std::string& why) {
  if (recorder_) recorder_->ended(seq, &why, 1, std::chrono::steady_clock::now());
}

void CallObserver::ended(const Run& run, uint64_t seq, const CollectiveSignature& sig,
                         const std::string& what, TimePoint queuedAt) {
  if (recorder_) recorder_->ended(seq, run.error, run.calls, run.finished);
  // stats()' latency per (collective, size class); SMDDP_TIMELINE's spans.
  // A run through the host segment has its own spans (the batch's phases).
  stats_.latency.record(static_cast<int>(sig.collective), sig.numel * elementSize(sig.dtype),
                        std::chrono::duration_cast<std::chrono::nanoseconds>(
                            run.finished - queuedAt).count());
  if (timeline::on()) {
    const bool segment = run.path != CallPath::kNetwork;
    const int64_t end = timeline::toNs(run.finished);
    if (!segment) timeline::ran(group_, seq, sig, timeline::toNs(run.started), end);
    timeline::call(group_, seq, sig, segment ? "shared-memory" : "libfabric",
                   timeline::toNs(queuedAt), end, run.error == nullptr);
  }
  if (logThreshold() >= LogLevel::kDebug) logEnded(run, seq, sig, what, queuedAt);
  stats_.collectives++;
}

void CallObserver::runEnded(const Run& run) {
  if (recorder_ && run.error) dumpFlightRecord(*recorder_, *run.error);
}

void CallObserver::logEnded(const Run& run, uint64_t seq, const CollectiveSignature& sig,
                            const std::string& what, TimePoint queuedAt) const {
  auto ms = [](auto d) {
    char b[32];
    snprintf(b, sizeof(b), "%.3f ms", std::chrono::duration<double, std::milli>(d).count());
    return std::string(b);
  };
  const std::string outcome = run.error ? "failed: " + *run.error : std::string("ok");
  const std::string batch = ", batch of " + std::to_string(run.calls) + " call(s) from seq " +
                            std::to_string(run.firstSeq);
  const std::string via = !run.fused                       ? std::string("libfabric")
                          : run.path != CallPath::kNetwork ? "shared memory" + batch
                                                           : "libfabric" + batch;
  SMDDP_LOG(kDebug) << "[rank " << rank_ << "] group '" << group_ << "' seq " << seq << " "
                    << (what.empty() ? sig.describe() : what) << " via " << via << ": queued "
                    << ms(run.started - queuedAt) << ", ran " << ms(run.finished - run.started)
                    << ", " << outcome;
}

}  // namespace smddp
