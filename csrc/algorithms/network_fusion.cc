// Fusion batches on the network-only path: the cut rule, and the path
// that cuts a batch from the engine's queue and runs it.
#include "algorithms/network_fusion.h"

#include <algorithm>
#include <string>

#include "common/error.h"
#include "algorithms/algorithms.h"
#include "algorithms/algorithms_config.h"
#include "engine/exchange.h"
#include "observe/batch_observer.h"

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

namespace {

class NetworkFusion final : public NetworkPath {
 public:
  NetworkFusion(EngineContext& ctx, std::string why) : NetworkPath(ctx, std::move(why)) {}
  bool fuses() const override { return true; }
  void run(AllreduceBatch& batch) override;

 private:
  // What this rank could fuse from batch.first() on: the calls already in
  // its own queue (so issued here).
  CutProposal proposeCut(AllreduceBatch& batch) const;
  // The cut's calls after the first, from this rank's queue, in order.
  std::vector<AllreduceCall*> takeRest(AllreduceBatch& batch, uint32_t cut) const;

  uint64_t batches_ = 0;  // batches run: worker thread only
};

CutProposal NetworkFusion::proposeCut(AllreduceBatch& batch) const {
  // Only what is queued now: every call in it is issued on this rank, so
  // the agreed cut (the least over the ranks) holds only calls every rank
  // has issued, and no rank waits for a call its caller has not made.
  const AllreduceCall& first = batch.first();
  CutProposal p;
  p.count = 1;
  p.dtype = static_cast<uint8_t>(first.dtype);
  p.op = static_cast<uint8_t>(first.op);
  p.numel[0] = first.numel;
  const size_t es = elementSize(first.dtype);
  uint64_t bytes = first.numel * es;
  // The visit stops before an overlap fence: the batch ends there. It
  // stops, too, before a call bigger than one chunk (SMDDP_CHUNK_BYTES):
  // such a call fills the pipeline alone, and fused it would only be copied
  // into the fusion buffer and back, around the network and on the cores
  // that run it. 4 hosts x 1 rank, DDP's 4 MB buckets issued together: 542
  // ms fused against 513 alone, and 338 against 259 with bf16 crossing
  // (docs/notes/2026-11-27-network-fusion-copies.md).
  batch.visitQueued([&](const AllreduceCall& c) {
    if (p.count >= static_cast<uint32_t>(kMaxFusedCalls) || c.seq != first.seq + p.count ||
        c.dtype != first.dtype || c.op != first.op ||
        c.numel * es > ctx_.config().chunkBytes ||
        bytes + c.numel * es > algorithmsConfig(ctx_.config()).fusionBytes) {
      return false;
    }
    p.numel[p.count++] = c.numel;
    bytes += c.numel * es;
    return true;
  });
  return p;
}

std::vector<AllreduceCall*> NetworkFusion::takeRest(AllreduceBatch& batch, uint32_t cut) const {
  // Each was in this rank's proposal, and only this thread takes from the
  // queue: a call missing there is an engine fault.
  const uint64_t firstSeq = batch.first().seq;
  std::vector<AllreduceCall*> rest;
  for (uint32_t i = 1; i < cut; ++i) {
    AllreduceCall* next = nullptr;
    auto expected = [&](const AllreduceCall& c) { return c.seq == firstSeq + i; };
    if (batch.takeNext(std::chrono::microseconds(0), expected, &next) !=
        AllreduceBatch::Take::kTaken) {
      throwError(ErrorKind::kInternal, "smddp: call " + std::to_string(firstSeq + i) +
                                           " of a fusion batch left the queue");
    }
    rest.push_back(next);
  }
  return rest;
}

void NetworkFusion::run(AllreduceBatch& batch) {
  const AllreduceCall& first = batch.first();
  const int64_t began = BatchObserver::begin();
  // 1. The first call runs at once, and every rank's proposal rides in its
  //    exchange: one small message to each peer, sent with the data, so a
  //    call that fuses with nothing costs no extra round trip.
  const int rank = ctx_.rank();
  std::vector<CutProposal> all(static_cast<size_t>(ctx_.size()));
  all[static_cast<size_t>(rank)] = proposeCut(batch);
  const CutProposal& mine = all[static_cast<size_t>(rank)];
  auto proposals = [&](Exchange& ex) {
    for (int p = 0; p < ctx_.size(); ++p) {
      if (p == rank) continue;
      ex.recv(p, kPhaseCut, 0, &all[static_cast<size_t>(p)], sizeof(CutProposal));
      ex.send(p, kPhaseCut, 0, 0, &mine, sizeof(CutProposal));
    }
  };
  allreduceBuffers(ctx_, first.seq, first.bufs, first.dtype, first.op, proposals);
  // 2. The same proposals on every rank give the same cut.
  uint32_t cut = 1;
  try {
    cut = agreedCut(all);
  } catch (const Error& e) {
    throwError(e.kind(), "smddp: " + first.signature().describe() + " at sequence " +
                             std::to_string(first.seq) + ": " + e.what());
  }
  batch.noteCut(first.seq + cut);
  // 3. The rest of the cut as one buffer, under its first call's sequence
  //    number (each rank's cut is the same, so are the numbers and sizes).
  const std::vector<AllreduceCall*> rest = takeRest(batch, cut);
  std::vector<Buffer> restBufs;
  uint64_t restNumel = 0;
  for (const AllreduceCall* c : rest) {
    restBufs.insert(restBufs.end(), c->bufs.begin(), c->bufs.end());
    restNumel += c->numel;
  }
  if (restNumel > 0) {
    allreduceBuffers(ctx_, first.seq + 1, restBufs, first.dtype, first.op, nullptr);
  }
  // Stall probes are answered from what each sequence number carried
  // (ControlPlane::noteSignature), which every Exchange records as it
  // ends: the first call's signature, and the rest's fused one under
  // first.seq + 1. Only the calls that ran no exchange of their own are
  // recorded here. (Recording the rest's first call over its exchange's
  // record told a peer stalled 200 ms in that exchange that this rank had
  // called something else, and it failed: 4 hosts x 1 rank, DDP with 4 MB
  // buckets; docs/notes/2026-11-27-false-mismatch.md.)
  const uint64_t lastExchanged = restNumel > 0 ? first.seq + 1 : first.seq;
  ControlPlane& control = ctx_.control();
  for (const AllreduceCall* c : rest) {
    if (c->seq > lastExchanged) control.noteSignature(c->seq, c->signature());
  }
  const uint64_t bytes = (first.numel + restNumel) * elementSize(first.dtype);
  ctx_.batches().batch(batches_, first.seq, cut, bytes, false, began);
  ++batches_;
}

}  // namespace

std::unique_ptr<AllreducePath> openNetworkFusion(EngineContext& ctx, std::string why) {
  return std::make_unique<NetworkFusion>(ctx, std::move(why));
}

}  // namespace smddp
