// The fusion scheduler (fusion_scheduler.h): its parameters, one batch's
// life (run), the group's description, and the waits, aborts and releases
// every phase shares. Who fuses what is in fusion_plan.cc, the data steps
// in fusion_steps.cc.
#include "hostpath/fusion_scheduler.h"

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "common/caller_waiting.h"
#include "common/error.h"
#include "common/param.h"
#include "hostpath/fusion_batch.h"
#include "observe/batch_observer.h"

namespace smddp {

SMDDP_PARAM_INT(paramStreamSpinUs, "SMDDP_STREAM_SPIN_US", 500, 0, 1000000,
                "microseconds a rank polls inside a shared-memory allreduce's data steps, where "
                "its peers are working on the same call, before it sleeps (hosts with more ranks "
                "than cores use SMDDP_SPIN_US instead)")
SMDDP_PARAM_BYTES(paramSmallBytes, "SMDDP_SMALL_BYTES", 65536, 0, 1LL << 28,
                  "fusion batches up to this size (and at most one SMDDP_SHM_SLOT_BYTES slot) run "
                  "in one step in which every rank reduces every rank's part (0: never)")
SMDDP_PARAM_INT(paramStragglerReport, "SMDDP_STRAGGLER_REPORT", 0, 0, 100,
                "log a warning when one rank of a host was the last to issue more than this "
                "percentage of the host's last 256 collectives and the waits it caused "
                "averaged 0.1 ms a call or more (checked every 256; 0: never). "
                "torch_smddp.stats()['stragglers'] has the counts either way")
SMDDP_PARAM_BYTES(paramStreamingBytes, "SMDDP_STREAMING_STORE_BYTES", 4194304, 0, 1LL << 50,
                  "fusion buffers at least this large copy results out with non-temporal stores, "
                  "unless a caller runs its own synchronous call on a host with a core per rank; "
                  "one-host all-gathers and reduce-scatters stage copies of private buffers for "
                  "their peers with them from this size, or whenever no caller waits")

void readFusionParams(HostPathConfig& h) {
  h.streamSpinUs = paramStreamSpinUs();
  h.streamingBytes = static_cast<uint64_t>(paramStreamingBytes());
  h.smallBytes = static_cast<uint64_t>(paramSmallBytes());
}


FusionBufferScheduler::FusionBufferScheduler(EngineContext& ctx,
                                             std::unique_ptr<HostSegment> segment,
                                             HostTopology topo, uint64_t fusionBytes)
    : ctx_(ctx), segment_(std::move(segment)), topo_(std::move(topo)),
      me_(topo_.localRank), leader_(topo_.ranksOfHost[topo_.hostIndex][0]),
      fusionBytes_(fusionBytes), servers_(segment_->servers()) {
  // With more ranks than cores a polling rank holds a core its peer needs.
  streamSpinUs_ = topo_.oversubscribed ? ctx.config().spinUs
                                        : std::max<int64_t>(ctx.config().spinUs,
                                                            hostPathConfig(ctx.config()).streamSpinUs);
  smallBytes_ = std::min<uint64_t>(hostPathConfig(ctx.config()).smallBytes, segment_->slotBytes());
  stragglerReport_ = static_cast<int>(paramStragglerReport());
}

FusionBufferScheduler::~FusionBufferScheduler() = default;

std::string FusionBufferScheduler::describe() const {
  auto kib = [](uint64_t b) { return std::to_string(b >> 10) + " KiB"; };
  std::string o = "through each host's shared-memory segment";
  if (topo_.hosts() > 1) o += ", then across hosts over libfabric";
  o += ": " + std::to_string(segment_->servers()) + " reduction server(s) per host, slot " +
       kib(segment_->slotBytes()) + " x depth " + std::to_string(segment_->depth()) +
       ", fusion buffer " + kib(fusionBytes_);
  if (standalone_ > 0) {
    o += ", plus " + std::to_string(standalone_) +
         " standalone reduction server(s) across hosts (SMDDP_SERVER_HOSTS)";
  }
  return o;
}

void FusionBufferScheduler::release() {
  serverLinks_.reset();
  hostCollectives_.reset();
  std::lock_guard<std::mutex> lock(segmentMu_);
  segment_.reset();
}

void FusionBufferScheduler::run(AllreduceBatch& batch) {
  using clock = std::chrono::steady_clock;
  std::vector<AllreduceCall*> calls{&batch.first()};
  Batch b;
  b.onCaller = batch.onCaller();
  b.index = nextBatch_;
  b.plan = &segment_->ctl().plans[b.index % kPlanDepth];
  b.firstSeq = calls[0]->seq;
  b.idleSince = clock::now();
  b.watch.emplace(ctx_, calls[0]->signature(), b.firstSeq, ctx_.waits().timeout());
  b.sigs.push_back(calls[0]->signature());
  const BatchObserver& observer = ctx_.batches();
  const int64_t began = BatchObserver::begin();
  try {
    if (me_ == 0) lead(b, calls, batch);
    else follow(b, calls, batch);
    observer.phase(BatchObserver::Phase::kCut, b.index, b.firstStep, b.firstStep + b.steps,
                   b.totalNumel * elementSize(b.dtype), began);
    stream(b, calls);
    // Every rank has joined (mismatches found at plan time are recorded
    // before a rank joins), so an abort is visible now or never.
    auto& ctl = segment_->ctl();
    while (true) {
      uint32_t seen = segment_->wakeValue();
      std::vector<int> missing;
      for (int p = 0; p < topo_.localSize; ++p) {
        if (ctl.arrived[p].value.load() < b.index + 1) missing.push_back(globalRank(p));
      }
      if (b.plan->aborted.load() == b.index + 1) idle(b, seen, [] { return std::string(); });
      if (missing.empty()) break;
      idle(b, seen, [&] { return rankList(missing); });
    }
  } catch (const Error& e) {
    // A timeout: the text the other ranks of the host read carries the
    // desync report too.
    const std::string text = ctx_.withDesyncReport(e);
    if (b.joined) {
      abortBatch(b, "rank " + std::to_string(ctx_.rank()) + " reported: " + text, e.kind());
      releaseBatch(b, b.firstStep + b.steps);
    }
    for (size_t i = 0; i < calls.size(); ++i) {
      ctx_.control().noteSignature(calls[i]->seq, calls[i]->signature());
    }
    if (text != e.what()) throw Error(e.kind(), text);
    throw;
  }
  for (AllreduceCall* c : calls) ctx_.control().noteSignature(c->seq, c->signature());
  observer.batch(b.index, calls[0]->seq, static_cast<uint32_t>(calls.size()),
                 b.totalNumel * elementSize(b.dtype), b.small, began);
}

uint64_t FusionBufferScheduler::chunkElems(DataType dt) const {
  const size_t slotElemBytes = widePartials(dt) ? sizeof(float) : elementSize(dt);
  return std::max<uint64_t>(1, segment_->slotBytes() / slotElemBytes);
}

DataType FusionBufferScheduler::crossHostWire(DataType dt, ReduceOp op) const {
  const bool f32Partials = dt == DataType::kFloat32 || widePartials(dt);
  if (topo_.hosts() < 2 || !f32Partials || (op != ReduceOp::kSum && op != ReduceOp::kAvg)) {
    return DataType::kFloat32;
  }
  return ctx_.config().crossHostDtype;
}

void FusionBufferScheduler::idle(Batch& b, uint32_t seenWake,
                                 const std::function<std::string()>& waitingOn, bool mayBlock) {
  using clock = std::chrono::steady_clock;
  if (b.joined && b.plan->aborted.load(std::memory_order_acquire) == b.index + 1) {
    std::string text(b.plan->abortText, strnlen(b.plan->abortText, kAbortTextBytes));
    throwError(b.plan->abortBreaks ? ErrorKind::kAborted : ErrorKind::kMismatch,
               "smddp: " + b.what() + " failed on another rank: " + text);
  }
  if (ctx_.waits().stopRequested()) {
    throwError(ErrorKind::kAborted, "smddp: " + b.what() + ": the process group was shut down");
  }
  auto now = clock::now();
  // Error frames, stall probes, the deadline and liveness: slow paths, so
  // looked at every 100 us, not on every poll.
  if (now >= b.nextNetworkCheck) {
    b.nextNetworkCheck = now + std::chrono::microseconds(100);
    ctx_.progress();
    b.watch->check(b.firstSeq, b.sigs.data(), b.sigs.size(), waitingOn, [&] {
      // Who has not reached this batch at all (this host's ranks; a rank on
      // another host shows up in the network step's own message).
      std::vector<int> absent;
      for (int p = 0; p < topo_.localSize; ++p) {
        if (segment_->ctl().arrived[p].value.load() < b.index + 1 && p != me_) {
          absent.push_back(globalRank(p));
        }
      }
      return absent.empty() ? std::string("every rank of this host was seen at this call")
                            : "not seen at this call: " + rankList(absent);
    });
  }
  if (!mayBlock) return;
  // Mid-stream, the awaited peer is working on this very call and its next
  // publish is microseconds away: a futex sleep there costs a wake-up per
  // step. Elsewhere a peer may be computing, so polling stays short. And
  // only while this rank's caller waits: if it computes (DDP's backward),
  // polling would take its core, so sleep at once.
  const int64_t spinUs = !aCallerIsWaiting() ? 0
                         : b.streaming     ? streamSpinUs_
                                           : ctx_.config().spinUs;
  if (now - b.idleSince < std::chrono::microseconds(spinUs)) {
    // With a core per rank, watch the wake word (every publish bumps it)
    // for a moment first: a peer's publish is then seen in well under a
    // microsecond, where a sched_yield round trip alone costs about half
    // of one, several times per small call.
    if (!topo_.oversubscribed && segment_->watchWake(seenWake)) return;
    sched_yield();  // polling, but let a runnable compute thread have the core
    return;
  }
  // Past the spin budget: sleep on the segment's futex until someone
  // publishes (bounded so the checks above keep running).
  segment_->sleep(seenWake, std::chrono::microseconds(2000));
}

void FusionBufferScheduler::skipBatch(Batch& b, const std::string& why) {
  auto& ctl = segment_->ctl();
  FusionPlan& p = *b.plan;
  if (p.aborted.load() != b.index + 1) abortBatch(b, why, ErrorKind::kMismatch);
  const uint64_t end = p.firstStep + p.steps;
  releaseBatch(b, end);
  nextBatch_ = b.index + 1;
  nextStep_ = end;
  b.index = nextBatch_;
  b.plan = &ctl.plans[b.index % kPlanDepth];
}

void FusionBufferScheduler::releaseBatch(Batch& b, uint64_t endStep) {
  // Mark this rank's part of batch b done (without doing it), so nobody
  // waits on it here or when the slots come round again.
  auto& ctl = segment_->ctl();
  for (SharedCounter* c : {&ctl.written[me_], &ctl.reduced[me_], &ctl.consumed[me_]}) {
    if (c->value.load() < endStep) c->value.store(endStep);
  }
  if (ctl.arrived[me_].value.load() < b.index + 1) ctl.arrived[me_].value.store(b.index + 1);
  segment_->wakeAll();
}

void FusionBufferScheduler::abortBatch(Batch& b, const std::string& why, ErrorKind kind) {
  FusionPlan& plan = *b.plan;
  uint32_t expected = 0;
  if (plan.abortLock.compare_exchange_strong(expected, 1)) {
    plan.abortBreaks = breaksGroup(kind) ? 1 : 0;
    size_t n = std::min(why.size(), kAbortTextBytes - 1);
    std::memcpy(plan.abortText, why.data(), n);
    plan.abortText[n] = 0;
    plan.aborted.store(b.index + 1, std::memory_order_release);
  }
  segment_->wakeAll();
}

void FusionBufferScheduler::failMismatch(Batch& b, const std::string& why) {
  std::string msg = "smddp: " + b.what() + ": " + why;
  abortBatch(b, "rank " + std::to_string(ctx_.rank()) + " reported: " + why, ErrorKind::kMismatch);
  throwError(ErrorKind::kMismatch, msg);
}

}  // namespace smddp
