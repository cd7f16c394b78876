// The fusion scheduler's plan: which queued allreduce calls form a batch.
// The host's leader cuts it from calls every rank has issued (rank 0 for
// every host when there are several), publishes it in the segment, and the
// other ranks take the same calls from their queues, checking each.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "common/error.h"
#include "common/logging.h"
#include "engine/exchange.h"
#include "hostpath/arrivals.h"
#include "hostpath/fusion_batch.h"
#include "hostpath/fusion_scheduler.h"

namespace smddp {

void FusionBufferScheduler::lead(Batch& b, std::vector<AllreduceCall*>& calls,
                                 AllreduceBatch& batch) {
  const AllreduceCall& first = *calls[0];
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
    takeRemotePlan(b, calls, batch);
  }
  // Fuse what is queued now: same dtype and op, consecutive, within budget,
  // and issued everywhere (Horovod's rule: a rank whose caller waits on
  // call k before issuing k + 1 must never be asked for k + 1 to finish k).
  // Never wait for more: the plan is the leader's to make, not to delay.
  while (planner && calls.size() < static_cast<size_t>(kMaxFusedCalls) && bytes < fusionBytes_) {
    AllreduceCall* next = nullptr;
    auto accept = [&](const AllreduceCall& c) {
      return c.dtype == first.dtype && c.op == first.op && c.seq == calls.back()->seq + 1 &&
             c.seq < limit && bytes + c.numel * es <= fusionBytes_;
    };
    if (batch.takeNext(std::chrono::microseconds(0), accept, &next) != Take::kTaken) break;
    calls.push_back(next);
    b.sigs.push_back(next->signature());
    bytes += next->numel * es;
  }
  if (planner && topo_.hosts() > 1) sendPlan(b, calls);
  uint64_t total = 0;
  for (const AllreduceCall* c : calls) total += c->numel;
  const int S = segment_->servers();
  const uint64_t chunkElems = this->chunkElems(first.dtype);
  const uint64_t maxShard = (total + S - 1) / S;
  b.small = smallBatch(total, first.dtype);
  b.firstStep = nextStep_;
  b.steps = b.small ? 1 : (maxShard + chunkElems - 1) / chunkElems;
  b.totalNumel = total;
  b.dtype = first.dtype;
  b.op = first.op;

  awaitPlanSlot(b);
  FusionPlan& plan = *b.plan;
  plan.firstSeq = b.firstSeq;
  plan.firstStep = b.firstStep;
  plan.steps = b.steps;
  plan.totalNumel = total;
  plan.count = static_cast<uint32_t>(calls.size());
  plan.dtype = static_cast<uint8_t>(b.dtype);
  plan.op = static_cast<uint8_t>(b.op);
  plan.small = b.small ? 1 : 0;
  for (size_t i = 0; i < calls.size(); ++i) plan.numel[i] = calls[i]->numel;
  plan.aborted.store(0);
  plan.abortLock.store(0);
  plan.abortBreaks = 0;
  plan.abortText[0] = 0;
  plan.published.store(b.index + 1, std::memory_order_release);
  nextBatch_ = b.index + 1;
  nextStep_ = b.firstStep + b.steps;
  b.joined = true;
  // Before this rank counts as arrived, so the next cut sees its fences
  // past this batch gone.
  batch.noteCut(calls.back()->seq + 1);
  segment_->publish(segment_->ctl().arrived[0], b.index + 1);
}

// The plan slot is free once every rank has joined the batch that used it
// kPlanDepth batches ago, and so has finished the one before.
void FusionBufferScheduler::awaitPlanSlot(Batch& b) {
  if (b.index + 2 <= static_cast<uint64_t>(kPlanDepth)) return;
  const uint64_t need = b.index + 2 - kPlanDepth;
  auto& ctl = segment_->ctl();
  while (true) {
    uint32_t seen = segment_->wakeValue();
    std::vector<int> behind;
    for (int p = 0; p < topo_.localSize; ++p) {
      if (ctl.arrived[p].value.load() < need) behind.push_back(globalRank(p));
    }
    if (behind.empty()) return;
    idle(b, seen, [&] { return rankList(behind); });
  }
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
  auto& ctl = segment_->ctl();
  const uint64_t from = issuedMark_;
  if (next <= from) {
    ctl.issued[me_].value.store(next, std::memory_order_release);
    return;
  }
  issuedMark_ = next;
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  stampArrivals(ctl.arrivals, me_, from, next, now);
  ctl.issued[me_].value.store(next, std::memory_order_release);
  if (topo_.localSize < 2) return;
  // Against a rank publishing at the same time: one of the two sees both.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const int boundaries = attributeArrivals(ctl.arrivals, topo_.localSize, from, next, [&](int p) {
    return ctl.issued[p].value.load(std::memory_order_acquire);
  });
  if (boundaries > 0 && stragglerReport_ > 0) reportStragglers();
}

Stragglers FusionBufferScheduler::stragglers() const {
  std::lock_guard<std::mutex> lock(segmentMu_);
  if (!segment_ || topo_.localSize < 2) return {};
  Stragglers s = readStragglers(segment_->ctl().arrivals, topo_.localSize);
  for (auto& row : s.rows) row.rank = globalRank(row.rank);
  return s;
}

void FusionBufferScheduler::reportStragglers() {
  Stragglers s = readStragglers(segment_->ctl().arrivals, topo_.localSize);
  if (s.calls < kStragglerWindow / 2) return;
  auto top = std::max_element(s.rows.begin(), s.rows.end(),
                              [](const auto& a, const auto& b) { return a.last < b.last; });
  if (top->last * 100 <= static_cast<uint64_t>(stragglerReport_) * s.calls) return;
  if (top->causedNs < kStragglerReportMinWaitNs * static_cast<int64_t>(s.calls)) return;
  char wait[32];
  std::snprintf(wait, sizeof(wait), "%.1f", static_cast<double>(top->causedNs) / 1e6);
  SMDDP_LOG(kWarn) << "smddp: group '" << ctx_.name() << "': rank " << globalRank(top->rank)
                   << " was the last to issue " << top->last << " of this host's last "
                   << s.calls << " collectives (" << (top->last * 100 / s.calls)
                   << "%), which alone kept the others waiting " << wait
                   << " ms (SMDDP_STRAGGLER_REPORT=" << stragglerReport_
                   << "; torch_smddp.stats()['stragglers'])";
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
  Exchange ex(ctx_, b.firstSeq, b.sigs[0]);
  for (int h = 1; h < topo_.hosts(); ++h) {
    ex.recv(topo_.ranksOfHost[h][0], kPhasePlan, 1, &issued[h], sizeof(uint64_t));
  }
  ex.run();
  uint64_t m = *std::min_element(issued.begin(), issued.end());
  return std::max(m, b.firstSeq + 1);
}

std::string FusionBufferScheduler::takeCut(
    Batch& b, std::vector<AllreduceCall*>& calls, uint32_t count, int planner,
    const std::function<CollectiveSignature(uint32_t)>& theirs, AllreduceBatch& batch) {
  // Every call of the cut is issued on this rank (the cut holds only
  // those), so it is queued or about to be; takeNext waits for it.
  auto differs = [&](uint32_t i, const std::string& mine) {
    return "rank " + std::to_string(planner) + " called " + theirs(i).describe() +
           " at sequence " + std::to_string(b.firstSeq + i) + " but this rank called " + mine;
  };
  auto check = [&](uint32_t i, const AllreduceCall& c, std::string* mismatch) {
    if (mismatch->empty() && (c.seq != b.firstSeq + i || !(c.signature() == theirs(i)))) {
      *mismatch = differs(i, c.signature().describe() + " at sequence " + std::to_string(c.seq));
    }
  };
  std::string mismatch;
  for (uint32_t i = 0; i < calls.size(); ++i) check(i, *calls[i], &mismatch);
  try {
    for (uint32_t i = static_cast<uint32_t>(calls.size()); i < count; ++i) {
      AllreduceCall* next = nullptr;
      while (true) {
        uint32_t seen = segment_->wakeValue();
        Take t = batch.takeNext(std::chrono::microseconds(200),
                                [](const AllreduceCall&) { return true; }, &next);
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
      check(i, *next, &mismatch);
    }
  } catch (const Error&) {
    if (mismatch.empty()) throw;
    // Still taking the rest of a batch that fails anyway: the mismatch is
    // the error to report.
  }
  return mismatch;
}

void FusionBufferScheduler::sendPlan(Batch& b, const std::vector<AllreduceCall*>& calls) {
  WirePlan wp{};
  wp.count = static_cast<uint32_t>(calls.size());
  wp.dtype = static_cast<uint8_t>(calls[0]->dtype);
  wp.op = static_cast<uint8_t>(calls[0]->op);
  for (size_t i = 0; i < calls.size(); ++i) wp.numel[i] = calls[i]->numel;
  Exchange ex(ctx_, b.firstSeq, b.sigs[0]);
  for (int h = 1; h < topo_.hosts(); ++h) {
    ex.send(topo_.ranksOfHost[h][0], kPhasePlan, 0, 0, &wp, sizeof(wp));
  }
  ex.run();
}

void FusionBufferScheduler::takeRemotePlan(Batch& b, std::vector<AllreduceCall*>& calls,
                                           AllreduceBatch& batch) {
  WirePlan wp{};
  const int planner = topo_.ranksOfHost[0][0];
  {
    // What this host has issued goes to rank 0; the cut comes back.
    const uint64_t issued = issuedOnHost(b.firstSeq);
    Exchange ex(ctx_, b.firstSeq, b.sigs[0]);
    ex.recv(planner, kPhasePlan, 0, &wp, sizeof(wp));
    ex.send(planner, kPhasePlan, 1, 0, &issued, sizeof(issued));
    ex.run();
  }
  if (wp.count < 1 || wp.count > static_cast<uint32_t>(kMaxFusedCalls) ||
      wp.dtype >= static_cast<uint8_t>(DataType::kCount) ||
      wp.op >= static_cast<uint8_t>(ReduceOp::kCount)) {
    throwError(ErrorKind::kProtocol, "smddp: " + b.what() + ": rank " + std::to_string(planner) +
                                         " sent an unreadable fusion plan (" +
                                         std::to_string(wp.count) + " calls)");
  }
  auto theirs = [&](uint32_t i) {
    return CollectiveSignature{CollectiveType::kAllreduce, static_cast<DataType>(wp.dtype),
                               static_cast<ReduceOp>(wp.op), wp.numel[i], -1};
  };
  // The rest of the cut comes from this rank's own queue, as on a follower.
  std::string why = takeCut(b, calls, wp.count, planner, theirs, batch);
  if (!why.empty()) throwError(ErrorKind::kMismatch, "smddp: " + b.what() + ": " + why);
}

void FusionBufferScheduler::follow(Batch& b, std::vector<AllreduceCall*>& calls,
                                   AllreduceBatch& batch) {
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
      std::string what = ctx_.control().calledAt(p.firstSeq, &mine) ? mine.describe()
                                                           : std::string("another collective");
      skipBatch(b, "rank " + std::to_string(ctx_.rank()) + " reported: rank " +
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
  b.small = plan.small != 0;
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
  // The rest of the leader's batch from this rank's queue.
  std::string why = takeCut(b, calls, plan.count, leader_, leaderCall, batch);
  if (!why.empty()) failMismatch(b, why);
  batch.noteCut(calls.back()->seq + 1);  // before arrived: see lead()
  segment_->publish(ctl.arrived[me_], b.index + 1);
}

}  // namespace smddp
