#include "engine/fusion_scheduler.h"

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <thread>

#include "common/caller_waiting.h"
#include "common/error.h"
#include "engine/communicator.h"
#include "engine/exchange.h"
#include "engine/fused_view.h"
#include "engine/reduce_kernels.h"
#include "engine/shard_plan.h"
#include "engine/stall_watch.h"
#include "engine/stream_copy.h"

namespace smddp {

CollectiveSignature FusibleCall::signature() const {
  return CollectiveSignature{CollectiveType::kAllreduce, dtype, op, numel, -1};
}

namespace {

std::string rankList(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return "rank(s) " + s;
}

}  // namespace

struct FusionBufferScheduler::Batch {
  uint64_t index = 0;
  FusionPlan* plan = nullptr;
  uint64_t firstSeq = 0;
  uint64_t firstStep = 0;
  uint64_t steps = 0;
  uint64_t totalNumel = 0;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  std::vector<CollectiveSignature> sigs;  // what this rank called, by position
  bool joined = false;                    // this rank published arrived
  std::string what;                       // for messages: the first call
  std::optional<StallWatch> watch;        // errors, probes, deadline, liveness
  std::chrono::steady_clock::time_point idleSince;
  bool streaming = false;  // in the data steps: every peer is in this call too
  std::chrono::steady_clock::time_point nextNetworkCheck{};
};

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
}

FusionBufferScheduler::~FusionBufferScheduler() = default;

void FusionBufferScheduler::run(std::vector<FusibleCall*>& calls, const TakeNext& takeNext) {
  using clock = std::chrono::steady_clock;
  Batch b;
  b.index = nextBatch_;
  b.plan = &segment_->ctl().plans[b.index % kPlanDepth];
  b.firstSeq = calls[0]->seq;
  b.what = calls[0]->signature().describe() + " at sequence " + std::to_string(b.firstSeq);
  b.idleSince = clock::now();
  b.watch.emplace(comm_, b.what, comm_.timeout());
  b.sigs.push_back(calls[0]->signature());
  try {
    if (me_ == 0) lead(b, calls, takeNext);
    else follow(b, calls, takeNext);
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
    if (b.joined) {
      abortBatch(b, "rank " + std::to_string(comm_.rank()) + " reported: " + e.what());
      releaseBatch(b, b.firstStep + b.steps);
    }
    for (size_t i = 0; i < calls.size(); ++i) {
      comm_.noteSignature(calls[i]->seq, calls[i]->signature());
    }
    throw;
  }
  for (FusibleCall* c : calls) comm_.noteSignature(c->seq, c->signature());
  auto& st = comm_.counters();
  st.fusionFlushes++;
  uint64_t bytes = b.totalNumel * elementSize(b.dtype);
  st.fusionBytes += bytes;
  st.fusedCalls += calls.size();
}

void FusionBufferScheduler::lead(Batch& b, std::vector<FusibleCall*>& calls,
                                 const TakeNext& takeNext) {
  const FusibleCall& first = *calls[0];
  const size_t es = elementSize(first.dtype);
  uint64_t bytes = first.numel * es;
  // Across hosts the group's rank 0 (host 0's leader) cuts every batch and
  // the other hosts' leaders take the same cut.
  const bool planner = topo_.hostIndex == 0;
  uint64_t limit = 0;  // fuse only sequences below this: issued on every rank
  if (planner) {
    limit = issuedOnHost(b.firstSeq);
    if (topo_.hosts() > 1) limit = std::min(limit, gatherIssued(b));
  } else {
    takeRemotePlan(b, calls, takeNext);
  }
  // Fuse what is queued now: same dtype and op, consecutive, within budget,
  // and issued everywhere (Horovod's rule: a rank whose caller waits on
  // call k before issuing k + 1 must never be asked for k + 1 to finish k).
  // Never wait for more: the plan is the leader's to make, not to delay.
  while (planner && calls.size() < static_cast<size_t>(kMaxFusedCalls) && bytes < fusionBytes_) {
    FusibleCall* next = nullptr;
    auto accept = [&](const FusibleCall& c) {
      return c.dtype == first.dtype && c.op == first.op && c.seq == calls.back()->seq + 1 &&
             c.seq < limit && bytes + c.numel * es <= fusionBytes_;
    };
    if (takeNext(std::chrono::microseconds(0), accept, &next) != Take::kTaken) break;
    calls.push_back(next);
    b.sigs.push_back(next->signature());
    bytes += next->numel * es;
  }
  if (planner && topo_.hosts() > 1) sendPlan(b, calls);
  uint64_t total = 0;
  for (const FusibleCall* c : calls) total += c->numel;
  const int S = segment_->servers();
  const uint64_t chunkElems = std::max<uint64_t>(1, segment_->slotBytes() / es);
  const uint64_t maxShard = (total + S - 1) / S;
  b.firstStep = nextStep_;
  b.steps = (maxShard + chunkElems - 1) / chunkElems;
  b.totalNumel = total;
  b.dtype = first.dtype;
  b.op = first.op;

  // The plan slot is free once every rank has joined the batch that used
  // it kPlanDepth batches ago, and so has finished the one before.
  auto& ctl = segment_->ctl();
  if (b.index + 2 > static_cast<uint64_t>(kPlanDepth)) {
    const uint64_t need = b.index + 2 - kPlanDepth;
    while (true) {
      uint32_t seen = segment_->wakeValue();
      std::vector<int> behind;
      for (int p = 0; p < topo_.localSize; ++p) {
        if (ctl.arrived[p].value.load() < need) behind.push_back(globalRank(p));
      }
      if (behind.empty()) break;
      idle(b, seen, [&] { return rankList(behind); });
    }
  }
  FusionPlan& plan = *b.plan;
  plan.firstSeq = b.firstSeq;
  plan.firstStep = b.firstStep;
  plan.steps = b.steps;
  plan.totalNumel = total;
  plan.count = static_cast<uint32_t>(calls.size());
  plan.dtype = static_cast<uint8_t>(b.dtype);
  plan.op = static_cast<uint8_t>(b.op);
  for (size_t i = 0; i < calls.size(); ++i) plan.numel[i] = calls[i]->numel;
  plan.aborted.store(0);
  plan.abortLock.store(0);
  plan.abortText[0] = 0;
  plan.published.store(b.index + 1, std::memory_order_release);
  nextBatch_ = b.index + 1;
  nextStep_ = b.firstStep + b.steps;
  b.joined = true;
  segment_->publish(ctl.arrived[0], b.index + 1);
}

namespace {

// A batch's cut as rank 0 sends it to the other hosts' leaders.
struct WirePlan {
  uint32_t count;
  uint8_t dtype;
  uint8_t op;
  uint8_t pad[2];
  uint64_t numel[kMaxFusedCalls];
};

}  // namespace

void FusionBufferScheduler::noteIssued(uint64_t next) {
  segment_->ctl().issued[me_].value.store(next, std::memory_order_release);
}

uint64_t FusionBufferScheduler::issuedOnHost(uint64_t firstSeq) const {
  uint64_t m = UINT64_MAX;
  for (int p = 0; p < topo_.localSize; ++p) {
    m = std::min(m, segment_->ctl().issued[p].value.load(std::memory_order_acquire));
  }
  return std::max(m, firstSeq + 1);
}

uint64_t FusionBufferScheduler::gatherIssued(Batch& b) {
  // Every other host's leader reports what its host has issued.
  std::vector<uint64_t> issued(topo_.hosts(), UINT64_MAX);
  Exchange ex(comm_, b.firstSeq, b.sigs[0]);
  for (int h = 1; h < topo_.hosts(); ++h) {
    ex.recv(topo_.ranksOfHost[h][0], kPhasePlan, 1, &issued[h], sizeof(uint64_t));
  }
  ex.run();
  uint64_t m = *std::min_element(issued.begin(), issued.end());
  return std::max(m, b.firstSeq + 1);
}

std::string FusionBufferScheduler::takeCut(
    Batch& b, std::vector<FusibleCall*>& calls, uint32_t count, int planner,
    const std::function<CollectiveSignature(uint32_t)>& theirs, std::string mismatch,
    const TakeNext& takeNext) {
  // Every call of the cut is issued on this rank (the cut holds only
  // those), so it is queued or about to be; takeNext waits for it.
  auto differs = [&](uint32_t i, const std::string& mine) {
    return "rank " + std::to_string(planner) + " called " + theirs(i).describe() +
           " at sequence " + std::to_string(b.firstSeq + i) + " but this rank called " + mine;
  };
  try {
    for (uint32_t i = static_cast<uint32_t>(calls.size()); i < count; ++i) {
      FusibleCall* next = nullptr;
      while (true) {
        uint32_t seen = segment_->wakeValue();
        Take t = takeNext(std::chrono::microseconds(200), [](const FusibleCall&) { return true; },
                          &next);
        if (t == Take::kTaken) break;
        if (t == Take::kOther) {
          return mismatch.empty() ? differs(i, "another collective at that sequence") : mismatch;
        }
        // takeNext already waited on the queue: only the checks, no sleep.
        idle(b, seen, [&] {
          return "this rank's own call at sequence " + std::to_string(b.firstSeq + i) +
                 " (the caller has not issued it)";
        }, /*mayBlock=*/false);
      }
      calls.push_back(next);
      b.sigs.push_back(next->signature());
      if (mismatch.empty() && (next->seq != b.firstSeq + i || !(next->signature() == theirs(i)))) {
        mismatch = differs(i, next->signature().describe() + " at sequence " +
                                  std::to_string(next->seq));
      }
    }
  } catch (const Error&) {
    if (mismatch.empty()) throw;
    // Still taking the rest of a batch that fails anyway: the mismatch is
    // the error to report.
  }
  return mismatch;
}

void FusionBufferScheduler::sendPlan(Batch& b, const std::vector<FusibleCall*>& calls) {
  WirePlan wp{};
  wp.count = static_cast<uint32_t>(calls.size());
  wp.dtype = static_cast<uint8_t>(calls[0]->dtype);
  wp.op = static_cast<uint8_t>(calls[0]->op);
  for (size_t i = 0; i < calls.size(); ++i) wp.numel[i] = calls[i]->numel;
  Exchange ex(comm_, b.firstSeq, b.sigs[0]);
  for (int h = 1; h < topo_.hosts(); ++h) {
    ex.send(topo_.ranksOfHost[h][0], kPhasePlan, 0, 0, &wp, sizeof(wp));
  }
  ex.run();
}

void FusionBufferScheduler::takeRemotePlan(Batch& b, std::vector<FusibleCall*>& calls,
                                           const TakeNext& takeNext) {
  WirePlan wp{};
  const int planner = topo_.ranksOfHost[0][0];
  {
    // What this host has issued goes to rank 0; the cut comes back.
    const uint64_t issued = issuedOnHost(b.firstSeq);
    Exchange ex(comm_, b.firstSeq, b.sigs[0]);
    ex.recv(planner, kPhasePlan, 0, &wp, sizeof(wp));
    ex.send(planner, kPhasePlan, 1, 0, &issued, sizeof(issued));
    ex.run();
  }
  if (wp.count < 1 || wp.count > static_cast<uint32_t>(kMaxFusedCalls) ||
      wp.dtype >= static_cast<uint8_t>(DataType::kCount) ||
      wp.op >= static_cast<uint8_t>(ReduceOp::kCount)) {
    throwError(ErrorKind::kProtocol, "smddp: " + b.what + ": rank " + std::to_string(planner) +
                                         " sent an unreadable fusion plan (" +
                                         std::to_string(wp.count) + " calls)");
  }
  auto theirs = [&](uint32_t i) {
    return CollectiveSignature{CollectiveType::kAllreduce, static_cast<DataType>(wp.dtype),
                               static_cast<ReduceOp>(wp.op), wp.numel[i], -1};
  };
  std::string first;
  if (!(calls[0]->signature() == theirs(0))) {
    first = "rank " + std::to_string(planner) + " called " + theirs(0).describe() +
            " at sequence " + std::to_string(b.firstSeq) + " but this rank called " +
            calls[0]->signature().describe() + " at sequence " + std::to_string(b.firstSeq);
  }
  // The rest of the cut comes from this rank's own queue, as on a follower.
  std::string why = takeCut(b, calls, wp.count, planner, theirs, first, takeNext);
  if (!why.empty()) throwError(ErrorKind::kMismatch, "smddp: " + b.what + ": " + why);
}

void FusionBufferScheduler::follow(Batch& b, std::vector<FusibleCall*>& calls,
                                   const TakeNext& takeNext) {
  auto& ctl = segment_->ctl();
  const uint64_t mySeq = calls[0]->seq;
  while (true) {
    FusionPlan& p = *b.plan;
    while (p.published.load(std::memory_order_acquire) != b.index + 1) {
      uint32_t seen = segment_->wakeValue();
      if (p.published.load(std::memory_order_acquire) == b.index + 1) break;
      idle(b, seen, [&] { return rankList({leader_}); });
    }
    if (p.firstSeq > mySeq) {
      // The leader made another collective at this rank's sequence (it is
      // past it). Ask it what, through a stall probe; idle() raises the
      // mismatch when the answer comes. The plan stays for the next call.
      b.watch->probeNow();
      while (true) {
        uint32_t seen = segment_->wakeValue();
        idle(b, seen, [&] { return "rank " + std::to_string(leader_) +
                                   "'s answer to what it called at sequence " +
                                   std::to_string(mySeq); });
      }
    }
    if (p.firstSeq + p.count <= mySeq) {
      // A batch this rank has no part in: its call at that sequence was
      // another collective (which has failed or will). Release the leader.
      CollectiveSignature leaders{CollectiveType::kAllreduce, static_cast<DataType>(p.dtype),
                                  static_cast<ReduceOp>(p.op), p.numel[0], -1};
      CollectiveSignature mine;
      std::string what = comm_.calledAt(p.firstSeq, &mine) ? mine.describe()
                                                           : std::string("another collective");
      skipBatch(b, "rank " + std::to_string(comm_.rank()) + " reported: rank " +
                       std::to_string(leader_) + " called " + leaders.describe() +
                       " at sequence " + std::to_string(p.firstSeq) + " but this rank called " +
                       what + " at sequence " + std::to_string(p.firstSeq));
      continue;
    }
    break;
  }
  FusionPlan& plan = *b.plan;
  b.firstStep = plan.firstStep;
  b.steps = plan.steps;
  b.totalNumel = plan.totalNumel;
  b.dtype = static_cast<DataType>(plan.dtype);
  b.op = static_cast<ReduceOp>(plan.op);
  nextBatch_ = b.index + 1;
  nextStep_ = b.firstStep + b.steps;
  b.joined = true;  // from here on, a failure must abort the batch for all

  auto leaderCall = [&](uint32_t i) {
    return CollectiveSignature{CollectiveType::kAllreduce, b.dtype, b.op, plan.numel[i], -1};
  };
  if (plan.firstSeq != mySeq) {
    failMismatch(b, "rank " + std::to_string(leader_) + " fused the allreduce calls from sequence " +
                        std::to_string(plan.firstSeq) +
                        " but this rank called another collective there (mismatch) and is at " +
                        std::to_string(mySeq));
  }
  std::string first;
  if (!(calls[0]->signature() == leaderCall(0))) {
    first = "rank " + std::to_string(leader_) + " called " + leaderCall(0).describe() +
            " at sequence " + std::to_string(mySeq) + " but this rank called " +
            calls[0]->signature().describe() + " at sequence " + std::to_string(mySeq);
  }
  // The rest of the leader's batch from this rank's queue.
  std::string why = takeCut(b, calls, plan.count, leader_, leaderCall, first, takeNext);
  if (!why.empty()) failMismatch(b, why);
  segment_->publish(ctl.arrived[me_], b.index + 1);
}

void FusionBufferScheduler::stream(Batch& b, const std::vector<FusibleCall*>& calls) {
  auto& ctl = segment_->ctl();
  HostSegment& seg = *segment_;
  const int rank = me_;
  const int n = topo_.localSize;
  const int S = seg.servers();
  const size_t es = elementSize(b.dtype);
  const uint64_t chunkElems = std::max<uint64_t>(1, seg.slotBytes() / es);
  const uint64_t depth = seg.depth();
  const uint64_t f = b.firstStep;
  const uint64_t end = b.firstStep + b.steps;
  const int myServer = seg.serverIndexOf(rank);
  const bool multiHost = topo_.hosts() > 1;
  const bool streaming = b.totalNumel * es >= comm_.config().streamingBytes;
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
  b.streaming = true;
  b.idleSince = std::chrono::steady_clock::now();
  uint64_t w = f, r = f, c = f;
  if (myServer < 0) r = end;
  while (c < end) {
    const uint32_t seen = seg.wakeValue();
    bool moved = false;
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
    // 2. As a server: once every rank wrote step r, combine the parts in
    //    rank order (bitwise reproducible) into the result slot.
    while (r < end && minOver(ctl.written, false) >= r + 1) {
      uint64_t off;
      uint64_t len = chunkOf(myServer, r, &off);
      if (len) {
        for (int p = 0; p < n; ++p) inputs[p] = seg.contribution(myServer, p, r);
        if (const uint8_t* own = view.direct(off, len)) inputs[rank] = own;
        auto t0 = std::chrono::steady_clock::now();
        // Across hosts, AVG sums here and divides once at the end.
        reduceOrdered(seg.result(myServer, r), inputs.data(), n, len, b.dtype,
                      multiHost && b.op == ReduceOp::kAvg ? ReduceOp::kSum : b.op,
                      multiHost ? 1.0 : n);
        st.serverReduceNs += std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 std::chrono::steady_clock::now() - t0).count();
      }
      if (multiHost) reduceAcrossHosts(b, myServer, r - f, seg.result(myServer, r), len);
      ++r;
      seg.publish(ctl.reduced[rank], r);
      moved = true;
    }
    // 3. Once every server reduced step c, copy the results out.
    while (c < end && minOver(ctl.reduced, true) >= c + 1) {
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
    if (w - c > st.chunksInFlightMax.load()) st.chunksInFlightMax = w - c;
    if (b.plan->aborted.load() == b.index + 1) idle(b, seen, [] { return std::string(); });
    if (moved) {
      b.idleSince = std::chrono::steady_clock::now();
      continue;
    }
    idle(b, seen, [&] {
      if (c < w && r < end && minOver(ctl.written, false) < r + 1) {
        return lagging(ctl.written, r + 1, false);
      }
      if (c < w) return lagging(ctl.reduced, c + 1, true);
      return lagging(ctl.consumed, w - depth + 1, false);
    });
  }
}

void FusionBufferScheduler::reduceAcrossHosts(Batch& b, int server, uint64_t chunk,
                                              uint8_t* data, uint64_t len) {
  // Reduction servers once more, between hosts: the chunk is cut into one
  // piece per host; host h's server for this shard combines piece h of
  // every host's partial, in host order (so every host gets the same
  // bits), and returns it. Two network steps, 2(H-1)/H of the chunk each way.
  const int H = topo_.hosts();
  const int myHost = topo_.hostIndex;
  const int local = segment_->serverRank(server);
  auto peerOf = [&](int h) { return topo_.ranksOfHost[h][local]; };
  const size_t es = elementSize(b.dtype);
  std::vector<Range> piece(H);
  for (int h = 0; h < H; ++h) piece[h] = balancedShard(len, H, h, chunk);
  const Range mine = piece[myHost];
  const size_t mineBytes = mine.count * es;
  uint8_t* partials = comm_.scratch(H * mineBytes + 1);
  const uint32_t tag = static_cast<uint32_t>(chunk);
  Exchange ex(comm_, b.firstSeq, b.sigs[0]);
  int remaining = H - 1;
  auto reduceAndReturn = [&] {
    std::vector<const void*> in(H);
    for (int h = 0; h < H; ++h) in[h] = h == myHost ? data + mine.offset * es : partials + h * mineBytes;
    auto t0 = std::chrono::steady_clock::now();
    reduceOrdered(data + mine.offset * es, in.data(), H, mine.count, b.dtype, b.op,
                  b.op == ReduceOp::kAvg ? static_cast<double>(comm_.size()) : 1.0);
    comm_.counters().serverReduceNs += std::chrono::duration_cast<std::chrono::nanoseconds>(
                                           std::chrono::steady_clock::now() - t0).count();
    for (int h = 0; h < H; ++h) {
      if (h != myHost) {
        ex.send(peerOf(h), kPhaseHostsReturn, tag, mine.offset * es, data + mine.offset * es,
                mineBytes);
      }
    }
  };
  // Receives first, so frames land in place; then this host's pieces out.
  for (int h = 0; h < H; ++h) {
    if (h == myHost) continue;
    ex.recv(peerOf(h), kPhaseHostsToServer, tag, partials + h * mineBytes, mineBytes, [&] {
      if (--remaining == 0) reduceAndReturn();
    });
    ex.recv(peerOf(h), kPhaseHostsReturn, tag, data + piece[h].offset * es, piece[h].count * es);
  }
  for (int h = 0; h < H; ++h) {
    if (h == myHost) continue;
    ex.send(peerOf(h), kPhaseHostsToServer, tag, piece[h].offset * es,
            data + piece[h].offset * es, piece[h].count * es);
  }
  ex.run();
}

void FusionBufferScheduler::idle(Batch& b, uint32_t seenWake,
                                 const std::function<std::string()>& waitingOn, bool mayBlock) {
  using clock = std::chrono::steady_clock;
  if (b.joined && b.plan->aborted.load(std::memory_order_acquire) == b.index + 1) {
    std::string text(b.plan->abortText, strnlen(b.plan->abortText, kAbortTextBytes));
    throwError(ErrorKind::kMismatch, "smddp: " + b.what + " failed on another rank: " + text);
  }
  if (comm_.stopRequested()) {
    throwError(ErrorKind::kAborted, "smddp: " + b.what + ": the process group was shut down");
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
  std::string msg = "smddp: " + b.what + ": " + why;
  abortBatch(b, "rank " + std::to_string(comm_.rank()) + " reported: " + why);
  throwError(ErrorKind::kMismatch, msg);
}

}  // namespace smddp
