// Fusion batches on the network-only path: the cut rule, and the
// Communicator's half that cuts a batch from its queue and runs it.
#include "hostpath/network_fusion.h"

#include <algorithm>
#include <string>

#include "common/error.h"
#include "algorithms/algorithms.h"
#include "engine/communicator.h"
#include "engine/exchange.h"
#include "hostpath/fusion_scheduler.h"
#include "observe/timeline.h"

namespace smddp {

uint32_t agreedCut(const std::vector<CutProposal>& proposals) {
  uint32_t cut = static_cast<uint32_t>(kMaxFusedCalls);
  for (size_t r = 0; r < proposals.size(); ++r) {
    const CutProposal& p = proposals[r];
    if (p.count < 1 || p.count > static_cast<uint32_t>(kMaxFusedCalls) ||
        p.dtype >= static_cast<uint8_t>(DataType::kCount) ||
        p.op >= static_cast<uint8_t>(ReduceOp::kCount)) {
      throwError(ErrorKind::kProtocol, "rank " + std::to_string(r) +
                                           " sent an unreadable fusion cut (" +
                                           std::to_string(p.count) + " calls)");
    }
    cut = std::min(cut, p.count);
  }
  if (proposals.empty()) return 1;
  const CutProposal& first = proposals[0];
  for (const CutProposal& p : proposals) {
    if (p.dtype != first.dtype || p.op != first.op) return 1;
  }
  for (uint32_t i = 1; i < cut; ++i) {
    for (const CutProposal& p : proposals) {
      if (p.numel[i] != first.numel[i]) return i;
    }
  }
  return cut;
}

CutProposal Communicator::proposeCut(const FusibleCall& first) {
  // Only what is queued now: every call in it is issued on this rank, so
  // the agreed cut (the least over the ranks) holds only calls every rank
  // has issued, and no rank waits for a call its caller has not made.
  CutProposal p;
  p.count = 1;
  p.dtype = static_cast<uint8_t>(first.dtype);
  p.op = static_cast<uint8_t>(first.op);
  p.numel[0] = first.numel;
  const size_t es = elementSize(first.dtype);
  uint64_t bytes = first.numel * es;
  std::lock_guard<std::mutex> lock(queueMu_);
  // A call that overlaps an earlier call the batch could hold is fenced
  // (enqueue): the batch ends before it.
  auto fence = std::upper_bound(fences_.begin(), fences_.end(), first.seq);
  const uint64_t fencedFrom = fence == fences_.end() ? UINT64_MAX : *fence;
  for (const Task& t : queue_) {
    if (p.count >= static_cast<uint32_t>(kMaxFusedCalls) || t.p2p || !t.fusible) break;
    const FusibleCall& c = *t.fusible;
    if (c.seq != first.seq + p.count || c.seq >= fencedFrom || c.dtype != first.dtype ||
        c.op != first.op || bytes + c.numel * es > config_.fusionBytes) {
      break;
    }
    p.numel[p.count++] = c.numel;
    bytes += c.numel * es;
  }
  return p;
}

void Communicator::runNetworkBatch(std::vector<Task>& tasks, CallPath path, bool onCaller) {
  // tasks grows below (pointers into it move): keep what is needed by value.
  const std::shared_ptr<FusibleCall> first = tasks[0].fusible;
  const uint64_t firstSeq = tasks[0].seq;
  const int64_t tlBegin = timeline::on() ? timeline::nowNs() : 0;
  // 1. The first call runs at once, and every rank's proposal rides in its
  //    exchange: one small message to each peer, sent with the data, so a
  //    call that fuses with nothing costs no extra round trip.
  std::vector<CutProposal> all(static_cast<size_t>(size()));
  all[static_cast<size_t>(rank())] = proposeCut(*first);
  const CutProposal& mine = all[static_cast<size_t>(rank())];
  auto proposals = [&](Exchange& ex) {
    for (int p = 0; p < size(); ++p) {
      if (p == rank()) continue;
      ex.recv(p, kPhaseCut, 0, &all[static_cast<size_t>(p)], sizeof(CutProposal));
      ex.send(p, kPhaseCut, 0, 0, &mine, sizeof(CutProposal));
    }
  };
  allreduceBuffers(*this, firstSeq, first->bufs, first->dtype, first->op, proposals);
  // 2. The same proposals on every rank give the same cut.
  uint32_t cut = 1;
  try {
    cut = agreedCut(all);
  } catch (const Error& e) {
    throwError(e.kind(), "smddp: " + tasks[0].name() + " at sequence " + std::to_string(firstSeq) +
                             ": " + e.what());
  }
  noteBatchCut(firstSeq + cut);
  // 3. The rest of the cut from this rank's queue: each was in its proposal,
  //    and only this thread takes from the queue.
  std::vector<Buffer> rest;
  uint64_t restNumel = 0;
  for (uint32_t i = 1; i < cut; ++i) {
    {
      std::lock_guard<std::mutex> lock(queueMu_);
      if (stopping_) {
        throwError(ErrorKind::kAborted, "smddp: " + tasks[0].name() + " at sequence " +
                                            std::to_string(firstSeq) +
                                            ": the process group was shut down");
      }
      if (queue_.empty() || !queue_.front().fusible || queue_.front().seq != firstSeq + i) {
        throwError(ErrorKind::kInternal, "smddp: call " + std::to_string(firstSeq + i) +
                                             " of a fusion batch left the queue");
      }
      tasks.push_back(std::move(queue_.front()));
      queue_.pop_front();
      queued_.store(queue_.size(), std::memory_order_release);
    }
    Task& t = tasks.back();
    if (recorder_) {
      recorder_->started(t.seq, path, firstSeq, onCaller, std::chrono::steady_clock::now());
    }
    // Every call before it has completed or rides in this batch, which
    // touches none of its memory (fences_).
    if (t.prepare) t.prepare();
    for (const Buffer& b : t.fusible->bufs) rest.push_back(b);
    restNumel += t.fusible->numel;
  }
  // 4. The rest as one buffer, under its first call's sequence number
  //    (each rank's cut is the same, so are the numbers and the sizes).
  if (restNumel > 0) {
    allreduceBuffers(*this, firstSeq + 1, rest, first->dtype, first->op, nullptr);
  }
  for (const Task& t : tasks) control_.noteSignature(t.seq, t.fusible->signature());
  const uint64_t bytes = (first->numel + restNumel) * elementSize(first->dtype);
  stats_.fusionFlushes++;
  stats_.fusionBytes += bytes;
  stats_.fusedCalls += tasks.size();
  if (timeline::on()) {
    timeline::batch(opts_.name, netBatches_, firstSeq, static_cast<uint32_t>(tasks.size()), bytes,
                    false, tlBegin, timeline::nowNs());
  }
  ++netBatches_;
}

}  // namespace smddp
