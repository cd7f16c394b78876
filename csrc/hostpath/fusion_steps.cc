// The fusion scheduler's data steps (fusion_scheduler.h): a batch streams
// through the host segment in steps, and every rank repeats three phases
// until its last step is out: copy in (its part of a step into every
// server's slot), combine (as a server: every rank's part in rank order,
// then, across hosts, the network step) and copy out (the servers'
// results into its tensors). A small batch is one step (streamSmall).
#include <sched.h>

#include <algorithm>
#include <memory>

#include "hostpath/cross_host.h"
#include "hostpath/fused_view.h"
#include "hostpath/fusion_batch.h"
#include "common/caller_waiting.h"
#include "hostpath/fusion_scheduler.h"
#include "observe/stats.h"
#include "observe/timeline.h"
#include "reduce/reduce_kernels.h"
#include "reduce/shard_plan.h"
#include "reduce/stream_copy.h"

namespace smddp {

// One batch's data steps as this rank runs them: the batch's geometry and
// three cursors, the next step to copy in (w), to combine (r) and to copy
// out (c). Step t carries chunk (t - first) of every shard.
struct FusionBufferScheduler::Steps {
  Steps(FusionBufferScheduler& sched, Batch& b, const std::vector<AllreduceCall*>& calls)
      : seg(*sched.segment_), ctl(seg.ctl()), sched(sched), rank(sched.me_),
        n(sched.topo_.localSize), S(seg.servers()), es(elementSize(b.dtype)),
        chunkElems(sched.chunkElems(b.dtype)), wide(sched.widePartials(b.dtype)),
        depth(seg.depth()), first(b.firstStep), end(b.firstStep + b.steps),
        myServer(seg.serverIndexOf(rank)), multiHost(sched.topo_.hosts() > 1),
        largeBatch(b.totalNumel * es >= sched.ctx_.config().streamingBytes), view(calls, es),
        shards(S), inputs(n), w(first), r(myServer < 0 ? end : first), c(first) {
    // Balanced: shards differ by at most one element, and the leftovers
    // rotate with the batch index so no server is favoured over a run.
    for (int s = 0; s < S; ++s) shards[s] = balancedShard(b.totalNumel, S, s, b.index);
    if (multiHost && myServer >= 0) {
      xh = std::make_unique<CrossHost>(sched, b, myServer, depth, chunkElems);
    }
  }

  // The elements of shard s in step t: how many, and (*off) from where.
  uint64_t chunkOf(int s, uint64_t t, uint64_t* off) const {
    uint64_t k = (t - first) * chunkElems;
    uint64_t len = shards[s].count;
    *off = shards[s].offset + std::min(k, len);
    return k >= len ? 0 : std::min(chunkElems, len - k);
  }
  // The least counter of every rank, or of the server ranks only.
  uint64_t minOver(SharedCounter* cs, bool serversOnly) const {
    uint64_t m = UINT64_MAX;
    if (serversOnly) {
      for (int s = 0; s < S; ++s) m = std::min(m, cs[seg.serverRank(s)].value.load());
    } else {
      for (int p = 0; p < n; ++p) m = std::min(m, cs[p].value.load());
    }
    return m;
  }
  // The ranks whose counter is below `need`, for messages.
  std::string lagging(SharedCounter* cs, uint64_t need, bool serversOnly) const {
    std::vector<int> ranks;
    for (int p = 0; p < n; ++p) {
      if (serversOnly && seg.serverIndexOf(p) < 0) continue;
      if (cs[p].value.load() < need) ranks.push_back(sched.globalRank(p));
    }
    return rankList(ranks);
  }

  HostSegment& seg;
  SegmentControl& ctl;
  const FusionBufferScheduler& sched;
  const int rank;  // in the segment
  const int n;
  const int S;
  const size_t es;
  const uint64_t chunkElems;
  const bool wide;
  const uint64_t depth;
  const uint64_t first, end;
  const int myServer;  // -1: not a server
  const bool multiHost;
  const bool largeBatch;
  const FusedView view;
  std::vector<Range> shards;
  std::vector<const void*> inputs;
  uint64_t w, r, c;
  std::unique_ptr<CrossHost> xh;  // across hosts, on a server rank
};

namespace {

// SMDDP_TIMELINE: one span per run of consecutive steps of a phase.
void markSteps(timeline::Phase p, const std::string& group, uint64_t batch, uint64_t from,
               uint64_t to, int64_t t0) {
  if (timeline::on() && to > from) {
    timeline::phase(p, group, batch, from, to, 0, t0, timeline::nowNs());
  }
}

}  // namespace

void FusionBufferScheduler::stream(Batch& b, const std::vector<AllreduceCall*>& calls) {
  b.streaming = true;
  b.idleSince = std::chrono::steady_clock::now();
  if (b.small) {
    streamSmall(b, calls);
    return;
  }
  Steps st(*this, b, calls);
  auto& stats = ctx_.counters();
  while (st.c < st.end) {
    const uint32_t seen = st.seg.wakeValue();
    bool moved = copyIn(b, st);
    moved = combine(b, st) || moved;
    moved = copyOut(b, st) || moved;
    if (st.w - st.c > stats.chunksInFlightMax.load()) stats.chunksInFlightMax = st.w - st.c;
    if (b.plan->aborted.load() == b.index + 1) idle(b, seen, [] { return std::string(); });
    if (moved) {
      b.idleSince = std::chrono::steady_clock::now();
      continue;
    }
    awaitSteps(b, st, seen);
  }
}

bool FusionBufferScheduler::copyIn(Batch& b, Steps& st) {
  const int64_t t0 = timeline::on() ? timeline::nowNs() : 0;
  const uint64_t w0 = st.w;
  auto& stats = ctx_.counters();
  // Copy this rank's part of step w into every server's slot. The slot is
  // free once every rank has copied out step w - depth.
  while (st.w < st.end &&
         (st.w < st.depth || st.minOver(st.ctl.consumed, false) >= st.w - st.depth + 1)) {
    for (int s = 0; s < st.S; ++s) {
      uint64_t off;
      uint64_t len = st.chunkOf(s, st.w, &off);
      // A server's own part stays in the caller's tensor (combine reads it
      // there): one copy fewer per byte it serves.
      if (s == st.myServer && st.view.direct(off, len)) continue;
      if (len) st.view.read(off, len, st.seg.contribution(s, st.rank, st.w));
      if (st.seg.serverRank(s) != st.rank) stats.bytesSent += len * st.es;
    }
    ++st.w;
    st.seg.publish(st.ctl.written[st.rank], st.w);
  }
  markSteps(timeline::Phase::kCopyIn, ctx_.name(), b.index, w0, st.w, t0);
  return st.w > w0;
}

bool FusionBufferScheduler::combine(Batch& b, Steps& st) {
  const int64_t t0 = timeline::on() ? timeline::nowNs() : 0;
  const uint64_t r0 = st.r;
  bool moved = false;
  // As a server: once every rank wrote step r, combine the parts in rank
  // order (bitwise reproducible) into the result slot.
  while (st.r < st.end && st.minOver(st.ctl.written, false) >= st.r + 1) {
    uint64_t off;
    uint64_t len = st.chunkOf(st.myServer, st.r, &off);
    if (len) reduceStep(b, st, off, len);
    ++st.r;
    if (st.xh) st.xh->post(st.r - 1 - st.first, st.seg.result(st.myServer, st.r - 1), len);
    else st.seg.publish(st.ctl.reduced[st.rank], st.r);
    moved = true;
  }
  // Across hosts, a step counts as reduced once its network step is done.
  if (st.xh && st.xh->poll()) {
    st.seg.publish(st.ctl.reduced[st.rank], st.first + st.xh->done());
    moved = true;
  }
  markSteps(timeline::Phase::kCombine, ctx_.name(), b.index, r0, st.r, t0);
  return moved;
}

void FusionBufferScheduler::reduceStep(Batch& b, Steps& st, uint64_t off, uint64_t len) {
  for (int p = 0; p < st.n; ++p) st.inputs[p] = st.seg.contribution(st.myServer, p, st.r);
  if (const uint8_t* own = st.view.direct(off, len)) st.inputs[st.rank] = own;
  // Across hosts, AVG sums here and divides once at the end, and f16/bf16
  // partials stay in f32 until then (one rounding in all).
  const ReduceOp hostOp = st.multiHost && b.op == ReduceOp::kAvg ? ReduceOp::kSum : b.op;
  timeServerReduce(ctx_.counters(), [&] {
    if (st.wide) {
      reduceOrderedToFloat(reinterpret_cast<float*>(st.seg.result(st.myServer, st.r)),
                           st.inputs.data(), st.n, len, b.dtype, hostOp);
    } else {
      reduceOrdered(st.seg.result(st.myServer, st.r), st.inputs.data(), st.n, len, b.dtype,
                    hostOp, st.multiHost ? 1.0 : st.n);
    }
  });
}

bool FusionBufferScheduler::copyOut(Batch& b, Steps& st) {
  const int64_t t0 = timeline::on() ? timeline::nowNs() : 0;
  const uint64_t c0 = st.c;
  auto& stats = ctx_.counters();
  // A large result goes out with streaming stores when the engine thread
  // writes it: the caller reads it on its own core, maybe while computing
  // (DDP's backward), and cache-to-cache transfers and evicting its working
  // set cost it more than the stores save. A caller running its own call
  // reads the result from its own core's caches next, so there it goes
  // through them (4-8 MiB at world 2: 1.3-1.4x faster;
  // benchmarks/RESULTS.md), unless ranks share cores, where another rank's
  // turn evicts it first.
  const bool streaming = st.largeBatch && (topo_.oversubscribed || !b.onCaller);
  // Once every server reduced step c, copy the results out.
  while (st.c < st.end && st.minOver(st.ctl.reduced, true) >= st.c + 1) {
    for (int s = 0; s < st.S; ++s) {
      uint64_t off;
      uint64_t len = st.chunkOf(s, st.c, &off);
      if (len) st.view.write(off, len, st.seg.result(s, st.c), streaming);
      if (st.seg.serverRank(s) != st.rank) stats.bytesReceived += len * st.es;
    }
    ++st.c;
    if (streaming) streamingFence();
    st.seg.publish(st.ctl.consumed[st.rank], st.c);
  }
  markSteps(timeline::Phase::kCopyOut, ctx_.name(), b.index, c0, st.c, t0);
  return st.c > c0;
}

void FusionBufferScheduler::awaitSteps(Batch& b, Steps& st, uint32_t seen) {
  // Waiting on the network: its completions publish nothing in the
  // segment, so poll them (yielding the core), then sleep only briefly.
  const bool onNetwork = st.xh && st.xh->inFlight();
  idle(b, seen, [&] {
    if (onNetwork) return st.xh->waitingOn();
    if (st.c < st.w && st.r < st.end && st.minOver(st.ctl.written, false) < st.r + 1) {
      return st.lagging(st.ctl.written, st.r + 1, false);
    }
    if (st.c < st.w) return st.lagging(st.ctl.reduced, st.c + 1, true);
    return st.lagging(st.ctl.consumed, st.w - st.depth + 1, false);
  }, !onNetwork);
  if (onNetwork) {
    // Only while a caller waits: during DDP's backward the caller computes,
    // and a server rank yielding in a loop for each step of the network
    // phase took the cores backward needed (docs/notes/2026-11-26-cross-host.md).
    if (aCallerIsWaiting() && std::chrono::steady_clock::now() - b.idleSince <
                                  std::chrono::microseconds(streamSpinUs_)) {
      sched_yield();
    } else {
      // Short: a step's network completions publish nothing that would
      // wake the sleep, and the loop moves at most a step or so per turn
      // (a 1 ms sleep here held bf16 crossing at 4 x 1 to 935 ms a DDP step
      // from 775; docs/notes/2026-11-26-cross-host.md).
      st.seg.sleep(seen, std::chrono::microseconds(50));
    }
  }
}

void FusionBufferScheduler::streamSmall(Batch& b, const std::vector<AllreduceCall*>& calls) {
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
  if (tl) timeline::phase(timeline::Phase::kCopyIn, ctx_.name(), b.index, w, w + 1, bytes, t0,
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
  uint8_t* result = out ? out : ctx_.memory().scratch(count * es);
  if (tl) t0 = timeline::nowNs();
  // Not a server's work: server_reduce_seconds stays the servers' own.
  reduceOrdered(result, inputs, n, count, b.dtype, b.op, n);
  if (tl) {
    const int64_t t1 = timeline::nowNs();
    timeline::phase(timeline::Phase::kCombine, ctx_.name(), b.index, w, w + 1, bytes, t0, t1);
    t0 = t1;
  }
  auto& st = ctx_.counters();
  if (!out) {
    view.write(0, count, result, false);
    if (tl) timeline::phase(timeline::Phase::kCopyOut, ctx_.name(), b.index, w, w + 1, bytes,
                            t0, timeline::nowNs());
  }
  st.smallBatches++;
  st.bytesSent += count * es * (n - 1);
  st.bytesReceived += count * es * (n - 1);
  // 3. Done with the peers' slots: they may reuse them (step w + depth).
  ctl.reduced[rank].value.store(w + 1);
  seg.publish(ctl.consumed[rank], w + 1);
}


}  // namespace smddp
