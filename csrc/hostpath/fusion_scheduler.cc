#include "hostpath/fusion_scheduler.h"

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <thread>

#include "common/caller_waiting.h"
#include "common/error.h"
#include "common/param.h"
#include "engine/communicator.h"
#include "hostpath/cross_host.h"
#include "engine/exchange.h"
#include "hostpath/fused_view.h"
#include "reduce/reduce_kernels.h"
#include "reduce/shard_plan.h"
#include "hostpath/fusion_batch.h"
#include "engine/stall_watch.h"
#include "reduce/stream_copy.h"
#include "observe/timeline.h"

namespace smddp {

namespace {
// Polls of the wake word between two sched_yield calls in idle() (about
// 2 us of pause instructions).
constexpr int kWakeWatchPolls = 64;

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}
}  // namespace

SMDDP_PARAM_INT(paramStreamSpinUs, "SMDDP_STREAM_SPIN_US", 500, 0, 1000000,
                "microseconds a rank polls inside a shared-memory allreduce's data steps, where "
                "its peers are working on the same call, before it sleeps (hosts with more ranks "
                "than cores use SMDDP_SPIN_US instead)")
SMDDP_PARAM_BYTES(paramSmallBytes, "SMDDP_SMALL_BYTES", 65536, 0, 1LL << 28,
                  "fusion batches up to this size (and at most one SMDDP_SHM_SLOT_BYTES slot) run "
                  "in one step in which every rank reduces every rank's part (0: never)")
SMDDP_PARAM_BYTES(paramStreamingBytes, "SMDDP_STREAMING_STORE_BYTES", 4194304, 0, 1LL << 50,
                  "fusion buffers at least this large copy results out with non-temporal stores, "
                  "unless a caller runs its own synchronous call on a host with a core per rank")

void readFusionParams(EngineConfig& c) {
  c.streamSpinUs = paramStreamSpinUs();
  c.streamingBytes = static_cast<uint64_t>(paramStreamingBytes());
  c.smallBytes = static_cast<uint64_t>(paramSmallBytes());
}


CollectiveSignature FusibleCall::signature() const {
  return CollectiveSignature{CollectiveType::kAllreduce, dtype, op, numel, -1};
}

FusionBufferScheduler::FusionBufferScheduler(Communicator& comm,
                                             std::unique_ptr<HostSegment> segment,
                                             HostTopology topo, uint64_t fusionBytes)
    : comm_(comm), segment_(std::move(segment)), topo_(std::move(topo)),
      me_(topo_.localRank), leader_(topo_.ranksOfHost[topo_.hostIndex][0]),
      fusionBytes_(fusionBytes) {
  // With more ranks than cores a polling rank holds a core its peer needs.
  streamSpinUs_ = topo_.oversubscribed ? comm.config().spinUs
                                        : std::max<int64_t>(comm.config().spinUs,
                                                            comm.config().streamSpinUs);
  smallBytes_ = std::min<uint64_t>(comm.config().smallBytes, segment_->slotBytes());
}

FusionBufferScheduler::~FusionBufferScheduler() = default;

void FusionBufferScheduler::run(std::vector<FusibleCall*>& calls, const TakeNext& takeNext,
                                bool onCaller) {
  using clock = std::chrono::steady_clock;
  Batch b;
  b.onCaller = onCaller;
  b.index = nextBatch_;
  b.plan = &segment_->ctl().plans[b.index % kPlanDepth];
  b.firstSeq = calls[0]->seq;
  b.idleSince = clock::now();
  b.watch.emplace(comm_, calls[0]->signature(), b.firstSeq, comm_.timeout());
  b.sigs.push_back(calls[0]->signature());
  const int64_t tlBegin = timeline::on() ? timeline::nowNs() : 0;
  try {
    if (me_ == 0) lead(b, calls, takeNext);
    else follow(b, calls, takeNext);
    if (timeline::on()) {
      timeline::phase(timeline::Phase::kCut, comm_.name(), b.index, b.firstStep,
                      b.firstStep + b.steps, b.totalNumel * elementSize(b.dtype), tlBegin,
                      timeline::nowNs());
    }
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
    const std::string text = comm_.withDesyncReport(e);
    if (b.joined) {
      abortBatch(b, "rank " + std::to_string(comm_.rank()) + " reported: " + text);
      releaseBatch(b, b.firstStep + b.steps);
    }
    for (size_t i = 0; i < calls.size(); ++i) {
      comm_.control().noteSignature(calls[i]->seq, calls[i]->signature());
    }
    if (text != e.what()) throw Error(e.kind(), text);
    throw;
  }
  for (FusibleCall* c : calls) comm_.control().noteSignature(c->seq, c->signature());
  auto& st = comm_.counters();
  st.fusionFlushes++;
  uint64_t bytes = b.totalNumel * elementSize(b.dtype);
  if (timeline::on()) {
    timeline::batch(comm_.name(), b.index, calls[0]->seq, static_cast<uint32_t>(calls.size()),
                    bytes, b.small, tlBegin, timeline::nowNs());
  }
  st.fusionBytes += bytes;
  st.fusedCalls += calls.size();
}

uint64_t FusionBufferScheduler::chunkElems(DataType dt) const {
  const size_t slotElemBytes = widePartials(dt) ? sizeof(float) : elementSize(dt);
  return std::max<uint64_t>(1, segment_->slotBytes() / slotElemBytes);
}

void FusionBufferScheduler::stream(Batch& b, const std::vector<FusibleCall*>& calls) {
  b.streaming = true;
  b.idleSince = std::chrono::steady_clock::now();
  if (b.small) {
    streamSmall(b, calls);
    return;
  }
  auto& ctl = segment_->ctl();
  HostSegment& seg = *segment_;
  const int rank = me_;
  const int n = topo_.localSize;
  const int S = seg.servers();
  const size_t es = elementSize(b.dtype);
  const uint64_t chunkElems = this->chunkElems(b.dtype);
  const bool wide = widePartials(b.dtype);
  const uint64_t depth = seg.depth();
  const uint64_t f = b.firstStep;
  const uint64_t end = b.firstStep + b.steps;
  const int myServer = seg.serverIndexOf(rank);
  const bool multiHost = topo_.hosts() > 1;
  const bool largeBatch = b.totalNumel * es >= comm_.config().streamingBytes;
  const FusedView view(calls, es);
  // Balanced: shards differ by at most one element, and the leftovers
  // rotate with the batch index so no server is favoured over a run.
  std::vector<Range> shards(S);
  for (int s = 0; s < S; ++s) shards[s] = balancedShard(b.totalNumel, S, s, b.index);
  auto shardOff = [&](int s) { return shards[s].offset; };
  auto shardLen = [&](int s) { return shards[s].count; };
  // Step t carries chunk (t - f) of every shard.
  auto chunkOf = [&](int s, uint64_t t, uint64_t* off) {
    uint64_t k = (t - f) * chunkElems;
    uint64_t len = shardLen(s);
    *off = shardOff(s) + std::min(k, len);
    return k >= len ? 0 : std::min(chunkElems, len - k);
  };
  auto minOver = [&](SharedCounter* cs, bool serversOnly) {
    uint64_t m = UINT64_MAX;
    if (serversOnly) {
      for (int s = 0; s < S; ++s) m = std::min(m, cs[seg.serverRank(s)].value.load());
    } else {
      for (int p = 0; p < n; ++p) m = std::min(m, cs[p].value.load());
    }
    return m;
  };
  auto lagging = [&](SharedCounter* cs, uint64_t need, bool serversOnly) {
    std::vector<int> ranks;
    for (int p = 0; p < n; ++p) {
      if (serversOnly && seg.serverIndexOf(p) < 0) continue;
      if (cs[p].value.load() < need) ranks.push_back(globalRank(p));
    }
    return rankList(ranks);
  };

  std::vector<const void*> inputs(n);
  auto& st = comm_.counters();
  uint64_t w = f, r = f, c = f;
  if (myServer < 0) r = end;
  std::unique_ptr<CrossHost> xh;
  if (multiHost && myServer >= 0) xh = std::make_unique<CrossHost>(*this, b, myServer, depth, chunkElems);
  // SMDDP_TIMELINE: one span per run of consecutive steps of a phase.
  const bool tl = timeline::on();
  auto mark = [&](timeline::Phase p, uint64_t from, uint64_t to, int64_t t0) {
    if (to > from) {
      timeline::phase(p, comm_.name(), b.index, from, to, 0, t0, timeline::nowNs());
    }
  };
  while (c < end) {
    const uint32_t seen = seg.wakeValue();
    bool moved = false;
    int64_t t0 = tl ? timeline::nowNs() : 0;
    const uint64_t w0 = w;
    // 1. Copy this rank's part of step w into every server's slot. The slot
    //    is free once every rank has copied out step w - depth.
    while (w < end && (w < depth || minOver(ctl.consumed, false) >= w - depth + 1)) {
      for (int s = 0; s < S; ++s) {
        uint64_t off;
        uint64_t len = chunkOf(s, w, &off);
        // A server's own part stays in the caller's tensor (step 2 reads it
        // there): one copy fewer per byte it serves.
        if (s == myServer && view.direct(off, len)) continue;
        if (len) view.read(off, len, seg.contribution(s, rank, w));
        if (seg.serverRank(s) != rank) st.bytesSent += len * es;
      }
      ++w;
      seg.publish(ctl.written[rank], w);
      moved = true;
    }
    if (tl) {
      mark(timeline::Phase::kCopyIn, w0, w, t0);
      t0 = timeline::nowNs();
    }
    const uint64_t r0 = r;
    // 2. As a server: once every rank wrote step r, combine the parts in
    //    rank order (bitwise reproducible) into the result slot.
    while (r < end && minOver(ctl.written, false) >= r + 1) {
      uint64_t off;
      uint64_t len = chunkOf(myServer, r, &off);
      if (len) {
        for (int p = 0; p < n; ++p) inputs[p] = seg.contribution(myServer, p, r);
        if (const uint8_t* own = view.direct(off, len)) inputs[rank] = own;
        auto t0 = std::chrono::steady_clock::now();
        // Across hosts, AVG sums here and divides once at the end, and
        // f16/bf16 partials stay in f32 until then (one rounding in all).
        const ReduceOp hostOp = multiHost && b.op == ReduceOp::kAvg ? ReduceOp::kSum : b.op;
        if (wide) {
          reduceOrderedToFloat(reinterpret_cast<float*>(seg.result(myServer, r)), inputs.data(),
                               n, len, b.dtype, hostOp);
        } else {
          reduceOrdered(seg.result(myServer, r), inputs.data(), n, len, b.dtype, hostOp,
                        multiHost ? 1.0 : n);
        }
        st.serverReduceNs += std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 std::chrono::steady_clock::now() - t0).count();
      }
      ++r;
      if (xh) xh->post(r - 1 - f, seg.result(myServer, r - 1), len);
      else seg.publish(ctl.reduced[rank], r);
      moved = true;
    }
    // Across hosts, a step counts as reduced once its network step is done.
    if (xh && xh->poll()) {
      seg.publish(ctl.reduced[rank], f + xh->done());
      moved = true;
    }
    if (tl) {
      mark(timeline::Phase::kCombine, r0, r, t0);
      t0 = timeline::nowNs();
    }
    const uint64_t c0 = c;
    // 3. Once every server reduced step c, copy the results out.
    while (c < end && minOver(ctl.reduced, true) >= c + 1) {
      // A large result goes out with streaming stores when the engine
      // thread writes it: the caller reads it on its own core, maybe while
      // computing (DDP's backward), and cache-to-cache transfers and
      // evicting its working set cost it more than the stores save. A
      // caller running its own call reads the result from its own core's
      // caches next, so there it goes through them (4-8 MiB at world 2:
      // 1.3-1.4x faster; benchmarks/RESULTS.md), unless ranks share
      // cores, where another rank's turn evicts it first.
      const bool streaming = largeBatch && (topo_.oversubscribed || !b.onCaller);
      for (int s = 0; s < S; ++s) {
        uint64_t off;
        uint64_t len = chunkOf(s, c, &off);
        if (len) view.write(off, len, seg.result(s, c), streaming);
        if (seg.serverRank(s) != rank) st.bytesReceived += len * es;
      }
      ++c;
      if (streaming) streamingFence();
      seg.publish(ctl.consumed[rank], c);
      moved = true;
    }
    if (tl) mark(timeline::Phase::kCopyOut, c0, c, t0);
    if (w - c > st.chunksInFlightMax.load()) st.chunksInFlightMax = w - c;
    if (b.plan->aborted.load() == b.index + 1) idle(b, seen, [] { return std::string(); });
    if (moved) {
      b.idleSince = std::chrono::steady_clock::now();
      continue;
    }
    // Waiting on the network: its completions publish nothing in the
    // segment, so poll them (yielding the core), then sleep only briefly.
    const bool onNetwork = xh && xh->inFlight();
    idle(b, seen, [&] {
      if (onNetwork) return xh->waitingOn();
      if (c < w && r < end && minOver(ctl.written, false) < r + 1) {
        return lagging(ctl.written, r + 1, false);
      }
      if (c < w) return lagging(ctl.reduced, c + 1, true);
      return lagging(ctl.consumed, w - depth + 1, false);
    }, !onNetwork);
    if (onNetwork) {
      if (std::chrono::steady_clock::now() - b.idleSince < std::chrono::microseconds(streamSpinUs_)) {
        sched_yield();
      } else {
        seg.sleep(seen, std::chrono::microseconds(50));
      }
    }
  }
}

void FusionBufferScheduler::streamSmall(Batch& b, const std::vector<FusibleCall*>& calls) {
  auto& ctl = segment_->ctl();
  HostSegment& seg = *segment_;
  const int n = topo_.localSize;
  const int rank = me_;
  const uint64_t w = b.firstStep;  // the batch's one step
  const uint64_t depth = seg.depth();
  const size_t es = elementSize(b.dtype);
  const uint64_t count = b.totalNumel;
  const FusedView view(calls, es);
  auto minOver = [&](SharedCounter* cs) {
    uint64_t m = UINT64_MAX;
    for (int p = 0; p < n; ++p) m = std::min(m, cs[p].value.load());
    return m;
  };
  auto waitAll = [&](SharedCounter* cs, uint64_t need) {
    while (true) {
      const uint32_t seen = seg.wakeValue();
      if (minOver(cs) >= need) return;
      // idle() raises an abort another rank recorded, the timeout, a lost
      // peer; it polls, then sleeps until the next publish.
      idle(b, seen, [&] {
        std::vector<int> behind;
        for (int p = 0; p < n; ++p) {
          if (cs[p].value.load() < need) behind.push_back(globalRank(p));
        }
        return rankList(behind);
      });
    }
  };
  // 1. This rank's whole part into its own slot of step w, once every rank
  //    has finished reading the step that used the slot before.
  if (w >= depth) waitAll(ctl.consumed, w - depth + 1);
  const bool tl = timeline::on();
  const uint64_t bytes = count * es;
  int64_t t0 = tl ? timeline::nowNs() : 0;
  view.read(0, count, seg.contribution(0, rank, w));
  seg.publish(ctl.written[rank], w + 1);
  if (tl) timeline::phase(timeline::Phase::kCopyIn, comm_.name(), b.index, w, w + 1, bytes, t0,
                          timeline::nowNs());
  // 2. Once every rank's part is there, combine them all in rank order,
  //    straight into the caller's tensor when the batch is one tensor (a
  //    kernel's output may be one of its inputs: this rank's own part is
  //    read from the tensor, the peers read its slot).
  waitAll(ctl.written, w + 1);
  const void* inputs[kHostMaxRanks];  // n <= kHostMaxRanks (the segment's own bound)
  for (int p = 0; p < n; ++p) inputs[p] = seg.contribution(0, p, w);
  uint8_t* out = view.direct(0, count);
  if (out) inputs[rank] = out;
  uint8_t* result = out ? out : comm_.scratch(count * es);
  if (tl) t0 = timeline::nowNs();
  // Not a server's work: server_reduce_seconds stays the servers' own.
  reduceOrdered(result, inputs, n, count, b.dtype, b.op, n);
  if (tl) {
    const int64_t t1 = timeline::nowNs();
    timeline::phase(timeline::Phase::kCombine, comm_.name(), b.index, w, w + 1, bytes, t0, t1);
    t0 = t1;
  }
  auto& st = comm_.counters();
  if (!out) {
    view.write(0, count, result, false);
    if (tl) timeline::phase(timeline::Phase::kCopyOut, comm_.name(), b.index, w, w + 1, bytes,
                            t0, timeline::nowNs());
  }
  st.smallBatches++;
  st.bytesSent += count * es * (n - 1);
  st.bytesReceived += count * es * (n - 1);
  // 3. Done with the peers' slots: they may reuse them (step w + depth).
  ctl.reduced[rank].value.store(w + 1);
  seg.publish(ctl.consumed[rank], w + 1);
}

void FusionBufferScheduler::idle(Batch& b, uint32_t seenWake,
                                 const std::function<std::string()>& waitingOn, bool mayBlock) {
  using clock = std::chrono::steady_clock;
  if (b.joined && b.plan->aborted.load(std::memory_order_acquire) == b.index + 1) {
    std::string text(b.plan->abortText, strnlen(b.plan->abortText, kAbortTextBytes));
    throwError(ErrorKind::kMismatch, "smddp: " + b.what() + " failed on another rank: " + text);
  }
  if (comm_.stopRequested()) {
    throwError(ErrorKind::kAborted, "smddp: " + b.what() + ": the process group was shut down");
  }
  auto now = clock::now();
  // Error frames, stall probes, the deadline and liveness: slow paths, so
  // looked at every 100 us, not on every poll.
  if (now >= b.nextNetworkCheck) {
    b.nextNetworkCheck = now + std::chrono::microseconds(100);
    comm_.progress();
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
                                           : comm_.config().spinUs;
  if (now - b.idleSince < std::chrono::microseconds(spinUs)) {
    // With a core per rank, watch the wake word (every publish bumps it)
    // for a moment first: a peer's publish is then seen in well under a
    // microsecond, where a sched_yield round trip alone costs about half
    // of one, several times per small call.
    if (!topo_.oversubscribed) {
      for (int i = 0; i < kWakeWatchPolls; ++i) {
        if (segment_->wakeValue() != seenWake) return;
        cpuRelax();
      }
    }
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
  if (p.aborted.load() != b.index + 1) abortBatch(b, why);
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

void FusionBufferScheduler::abortBatch(Batch& b, const std::string& why) {
  FusionPlan& plan = *b.plan;
  uint32_t expected = 0;
  if (plan.abortLock.compare_exchange_strong(expected, 1)) {
    size_t n = std::min(why.size(), kAbortTextBytes - 1);
    std::memcpy(plan.abortText, why.data(), n);
    plan.abortText[n] = 0;
    plan.aborted.store(b.index + 1, std::memory_order_release);
  }
  segment_->wakeAll();
}

void FusionBufferScheduler::failMismatch(Batch& b, const std::string& why) {
  std::string msg = "smddp: " + b.what() + ": " + why;
  abortBatch(b, "rank " + std::to_string(comm_.rank()) + " reported: " + why);
  throwError(ErrorKind::kMismatch, msg);
}

}  // namespace smddp
