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
#include "observe/batch_observer.h"
#include "observe/stats.h"
#include "reduce/reduce_kernels.h"
#include "reduce/shard_plan.h"
#include "reduce/stream_copy.h"

namespace smddp {

// One batch's data steps as this rank runs them: the batch's geometry and
// three cursors, the next step to copy in (written), to combine (reduced)
// and to copy out (copiedOut); each is also how far this rank got in that
// phase. Step t carries chunk (t - first) of every shard.
struct FusionBufferScheduler::Steps {
  Steps(FusionBufferScheduler& sched, Batch& b, const std::vector<AllreduceCall*>& calls)
      : seg(*sched.segment_), ctl(seg.ctl()), sched(sched), rank(sched.me_),
        ranks(sched.topo_.localSize), servers(seg.servers()), elemBytes(elementSize(b.dtype)),
        chunkElems(sched.chunkElems(b.dtype)), wide(sched.widePartials(b.dtype)),
        depth(seg.depth()), first(b.firstStep), end(b.firstStep + b.steps),
        myServer(seg.serverIndexOf(rank)), multiHost(sched.topo_.hosts() > 1),
        largeBatch(b.totalNumel * elemBytes >= hostPathConfig(sched.ctx_.config()).streamingBytes),
        view(calls, elemBytes), shards(servers), inputs(ranks), written(first),
        reduced(myServer < 0 ? end : first), copiedOut(first) {
    // Balanced: shards differ by at most one element, and the leftovers
    // rotate with the batch index so no server is favoured over a run.
    for (int s = 0; s < servers; ++s) {
      shards[s] = balancedShard(b.totalNumel, servers, s, b.index);
    }
    if (multiHost && myServer >= 0) {
      crossHost = std::make_unique<CrossHost>(sched, b, myServer, depth, chunkElems);
    }
  }

  // The elements of shard s in step t: how many, and (*off) from where.
  uint64_t chunkOf(int s, uint64_t t, uint64_t* off) const {
    uint64_t from = (t - first) * chunkElems;
    uint64_t len = shards[s].count;
    *off = shards[s].offset + std::min(from, len);
    return from >= len ? 0 : std::min(chunkElems, len - from);
  }
  // The least counter of every rank, or of the server ranks only.
  uint64_t minOver(SharedCounter* cs, bool serversOnly) const {
    uint64_t least = UINT64_MAX;
    if (serversOnly) {
      for (int s = 0; s < servers; ++s) least = std::min(least, cs[seg.serverRank(s)].value.load());
    } else {
      for (int p = 0; p < ranks; ++p) least = std::min(least, cs[p].value.load());
    }
    return least;
  }
  // The ranks whose counter is below `need`, for messages.
  std::string lagging(SharedCounter* cs, uint64_t need, bool serversOnly) const {
    std::vector<int> behind;
    for (int p = 0; p < ranks; ++p) {
      if (serversOnly && seg.serverIndexOf(p) < 0) continue;
      if (cs[p].value.load() < need) behind.push_back(sched.globalRank(p));
    }
    return rankList(behind);
  }

  HostSegment& seg;
  SegmentControl& ctl;
  const FusionBufferScheduler& sched;
  const int rank;     // in the segment
  const int ranks;    // the host's
  const int servers;  // reduction servers of the host
  const size_t elemBytes;
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
  uint64_t written, reduced, copiedOut;
  std::unique_ptr<CrossHost> crossHost;  // across hosts, on a server rank
};

void FusionBufferScheduler::stream(Batch& b, const std::vector<AllreduceCall*>& calls) {
  b.streaming = true;
  b.idleSince = std::chrono::steady_clock::now();
  if (b.small) {
    streamSmall(b, calls);
    return;
  }
  Steps st(*this, b, calls);
  const BatchObserver& observer = ctx_.batches();
  while (st.copiedOut < st.end) {
    const uint32_t seen = st.seg.wakeValue();
    bool moved = copyIn(b, st);
    moved = combine(b, st) || moved;
    moved = copyOut(b, st) || moved;
    observer.stepsInFlight(st.written - st.copiedOut);
    if (b.plan->aborted.load() == b.index + 1) idle(b, seen, [] { return std::string(); });
    if (moved) {
      b.idleSince = std::chrono::steady_clock::now();
      continue;
    }
    awaitSteps(b, st, seen);
  }
}

bool FusionBufferScheduler::copyIn(Batch& b, Steps& st) {
  const uint64_t from = st.written;
  const BatchObserver& observer = ctx_.batches();
  const auto span = observer.steps(BatchObserver::Phase::kCopyIn, b.index, st.written);
  // Copy this rank's part of the next step into every server's slot. The
  // slot is free once every rank has copied out the step `depth` before.
  auto slotFree = [&] {
    return st.written < st.depth ||
           st.minOver(st.ctl.consumed, false) >= st.written - st.depth + 1;
  };
  while (st.written < st.end && slotFree()) {
    for (int s = 0; s < st.servers; ++s) {
      uint64_t off;
      uint64_t len = st.chunkOf(s, st.written, &off);
      // A server's own part stays in the caller's tensor (combine reads it
      // there): one copy fewer per byte it serves.
      if (s == st.myServer && st.view.direct(off, len)) continue;
      if (len) st.view.read(off, len, st.seg.contribution(s, st.rank, st.written));
      if (st.seg.serverRank(s) != st.rank) observer.sentOnHost(len * st.elemBytes);
    }
    ++st.written;
    st.seg.publish(st.ctl.written[st.rank], st.written);
  }
  return st.written > from;
}

bool FusionBufferScheduler::combine(Batch& b, Steps& st) {
  const auto span = ctx_.batches().steps(BatchObserver::Phase::kCombine, b.index, st.reduced);
  bool moved = false;
  // As a server: once every rank wrote the next step to combine, combine
  // the parts in rank order (bitwise reproducible) into the result slot.
  while (st.reduced < st.end && st.minOver(st.ctl.written, false) >= st.reduced + 1) {
    uint64_t off;
    uint64_t len = st.chunkOf(st.myServer, st.reduced, &off);
    if (len) reduceStep(b, st, off, len);
    ++st.reduced;
    if (st.crossHost) {
      st.crossHost->post(st.reduced - 1 - st.first, st.seg.result(st.myServer, st.reduced - 1),
                         len);
    } else {
      st.seg.publish(st.ctl.reduced[st.rank], st.reduced);
    }
    moved = true;
  }
  // Across hosts, a step counts as reduced once its network step is done.
  if (st.crossHost && st.crossHost->poll()) {
    st.seg.publish(st.ctl.reduced[st.rank], st.first + st.crossHost->done());
    moved = true;
  }
  return moved;
}

void FusionBufferScheduler::reduceStep(Batch& b, Steps& st, uint64_t off, uint64_t len) {
  for (int p = 0; p < st.ranks; ++p) st.inputs[p] = st.seg.contribution(st.myServer, p, st.reduced);
  if (const uint8_t* own = st.view.direct(off, len)) st.inputs[st.rank] = own;
  // Across hosts, AVG sums here and divides once at the end, and f16/bf16
  // partials stay in f32 until then (one rounding in all).
  const ReduceOp hostOp = st.multiHost && b.op == ReduceOp::kAvg ? ReduceOp::kSum : b.op;
  ctx_.traffic().serverReduce([&] {
    if (st.wide) {
      reduceOrderedToFloat(reinterpret_cast<float*>(st.seg.result(st.myServer, st.reduced)),
                           st.inputs.data(), st.ranks, len, b.dtype, hostOp);
    } else {
      reduceOrdered(st.seg.result(st.myServer, st.reduced), st.inputs.data(), st.ranks, len,
                    b.dtype, hostOp, st.multiHost ? 1.0 : st.ranks);
    }
  });
}

bool FusionBufferScheduler::copyOut(Batch& b, Steps& st) {
  const uint64_t from = st.copiedOut;
  const BatchObserver& observer = ctx_.batches();
  const auto span = observer.steps(BatchObserver::Phase::kCopyOut, b.index, st.copiedOut);
  // A large result goes out with streaming stores when the engine thread
  // writes it: the caller reads it on its own core, maybe while computing
  // (DDP's backward), and cache-to-cache transfers and evicting its working
  // set cost it more than the stores save. A caller running its own call
  // reads the result from its own core's caches next, so there it goes
  // through them (4-8 MiB at world 2: 1.3-1.4x faster;
  // benchmarks/RESULTS.md), unless ranks share cores, where another rank's
  // turn evicts it first.
  const bool streaming = st.largeBatch && (topo_.oversubscribed || !b.onCaller);
  // Once every server reduced the next step to copy out, copy the results out.
  while (st.copiedOut < st.end && st.minOver(st.ctl.reduced, true) >= st.copiedOut + 1) {
    for (int s = 0; s < st.servers; ++s) {
      uint64_t off;
      uint64_t len = st.chunkOf(s, st.copiedOut, &off);
      if (len) st.view.write(off, len, st.seg.result(s, st.copiedOut), streaming);
      if (st.seg.serverRank(s) != st.rank) observer.receivedOnHost(len * st.elemBytes);
    }
    ++st.copiedOut;
    if (streaming) streamingFence();
    st.seg.publish(st.ctl.consumed[st.rank], st.copiedOut);
  }
  return st.copiedOut > from;
}

void FusionBufferScheduler::awaitSteps(Batch& b, Steps& st, uint32_t seen) {
  // Waiting on the network: its completions publish nothing in the
  // segment, so poll them (yielding the core), then sleep only briefly.
  const bool onNetwork = st.crossHost && st.crossHost->inFlight();
  idle(b, seen, [&] {
    if (onNetwork) return st.crossHost->waitingOn();
    if (st.copiedOut < st.written && st.reduced < st.end &&
        st.minOver(st.ctl.written, false) < st.reduced + 1) {
      return st.lagging(st.ctl.written, st.reduced + 1, false);
    }
    if (st.copiedOut < st.written) return st.lagging(st.ctl.reduced, st.copiedOut + 1, true);
    return st.lagging(st.ctl.consumed, st.written - st.depth + 1, false);
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
  const int ranks = topo_.localSize;
  const int rank = me_;
  const uint64_t step = b.firstStep;  // the batch's one step
  const uint64_t depth = seg.depth();
  const size_t elemBytes = elementSize(b.dtype);
  const uint64_t count = b.totalNumel;
  const FusedView view(calls, elemBytes);
  auto minOver = [&](SharedCounter* cs) {
    uint64_t least = UINT64_MAX;
    for (int p = 0; p < ranks; ++p) least = std::min(least, cs[p].value.load());
    return least;
  };
  auto waitAll = [&](SharedCounter* cs, uint64_t need) {
    while (true) {
      const uint32_t seen = seg.wakeValue();
      if (minOver(cs) >= need) return;
      // idle() raises an abort another rank recorded, the timeout, a lost
      // peer; it polls, then sleeps until the next publish.
      idle(b, seen, [&] {
        std::vector<int> behind;
        for (int p = 0; p < ranks; ++p) {
          if (cs[p].value.load() < need) behind.push_back(globalRank(p));
        }
        return rankList(behind);
      });
    }
  };
  const BatchObserver& observer = ctx_.batches();
  using Phase = BatchObserver::Phase;
  // 1. This rank's whole part into its own slot of the step, once every
  //    rank has finished reading the step that used the slot before.
  if (step >= depth) waitAll(ctl.consumed, step - depth + 1);
  const uint64_t bytes = count * elemBytes;
  int64_t phaseBegin = BatchObserver::begin();
  view.read(0, count, seg.contribution(0, rank, step));
  seg.publish(ctl.written[rank], step + 1);
  observer.phase(Phase::kCopyIn, b.index, step, step + 1, bytes, phaseBegin);
  // 2. Once every rank's part is there, combine them all in rank order,
  //    straight into the caller's tensor when the batch is one tensor (a
  //    kernel's output may be one of its inputs: this rank's own part is
  //    read from the tensor, the peers read its slot).
  waitAll(ctl.written, step + 1);
  const void* inputs[kHostMaxRanks];  // ranks <= kHostMaxRanks (the segment's own bound)
  for (int p = 0; p < ranks; ++p) inputs[p] = seg.contribution(0, p, step);
  uint8_t* out = view.direct(0, count);
  if (out) inputs[rank] = out;
  uint8_t* result = out ? out : ctx_.memory().scratch(bytes);
  phaseBegin = BatchObserver::begin();
  // Not a server's work: server_reduce_seconds stays the servers' own.
  reduceOrdered(result, inputs, ranks, count, b.dtype, b.op, ranks);
  phaseBegin = observer.phase(Phase::kCombine, b.index, step, step + 1, bytes, phaseBegin);
  if (!out) {
    view.write(0, count, result, false);
    observer.phase(Phase::kCopyOut, b.index, step, step + 1, bytes, phaseBegin);
  }
  observer.smallBatch(bytes, ranks - 1);
  // 3. Done with the peers' slots: they may reuse them (step + depth).
  ctl.reduced[rank].value.store(step + 1);
  seg.publish(ctl.consumed[rank], step + 1);
}

}  // namespace smddp
