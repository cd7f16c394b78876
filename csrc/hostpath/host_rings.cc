// All-gather on one host, once a rank receives 4 MiB, through the segment's rings
// (docs/design.md, "All-gather and reduce-scatter on one host"). Each rank
// copies its part into a ring of its own, a chunk at a time, and copies
// its peers' chunks out of theirs as soon as they are there: two copies,
// but the second reads from cache, and no page of a peer is pinned. On the
// development VM, 64 MiB all-gathers back to back took 20-21 ms at world 4
// this way against 27-32 ms reading the peers' buffers with
// process_vm_readv, and about the same at world 2
// (docs/notes/2026-12-05-gather-rings.md). Reduce-scatter keeps
// process_vm_readv: through the rings (each rank's blocks for the others
// written in, each owner adding its chunks from every ring) it was slower,
// 31 ms against 24 at world 4.
#include <algorithm>
#include <cstring>

#include "hostpath/host_collectives.h"
#include "reduce/stream_copy.h"

namespace smddp {

std::vector<uint64_t> SegmentCollectives::ringStarts() {
  SegmentControl& ctl = segment_.ctl();
  std::vector<uint64_t> start(ranks_);
  for (int p = 0; p < ranks_; ++p) {
    start[p] = postOf(p).ringStart;
    // A position an earlier call left unread (it failed half way) is
    // skipped, so its writer never waits for it.
    if (p != local_) ctl.gatherRead[local_].of[p].store(start[p], std::memory_order_release);
  }
  return start;
}

bool SegmentCollectives::ringSlotFree(uint64_t pos) const {
  if (pos < kGatherSlots) return true;  // no earlier position held this slot
  const SegmentControl& ctl = segment_.ctl();
  for (int q = 0; q < ranks_; ++q) {
    if (q != local_ &&
        ctl.gatherRead[q].of[local_].load(std::memory_order_acquire) + kGatherSlots <= pos) {
      return false;
    }
  }
  return true;
}

uint64_t SegmentCollectives::ringWritten(int p) const {
  return segment_.ctl().gatherWritten[p].value.load(std::memory_order_acquire);
}

void SegmentCollectives::ringPut(uint64_t pos, const uint8_t* from, uint64_t len) {
  std::memcpy(segment_.gatherSlot(local_, pos), from, len);
  segment_.ctl().gatherWritten[local_].value.store(pos + 1, std::memory_order_release);
}

void SegmentCollectives::gatherThroughRings(EngineContext& ctx, StallWatch& watch, uint64_t seq,
                                            const CollectiveSignature& sig, const uint8_t* src,
                                            const std::vector<Buffer>& outs, uint64_t bytes) {
  SegmentControl& ctl = segment_.ctl();
  const int host = topo_.hostIndex;
  // A slot's worth each, whatever the part's size (splitChunks is the
  // wire's cut: it grows chunks past a slot for parts over 16 MiB).
  const uint64_t chunks = (bytes + kGatherSlotBytes - 1) / kGatherSlotBytes;
  auto offset = [](uint64_t k) { return k * kGatherSlotBytes; };
  auto length = [&](uint64_t k) { return std::min(kGatherSlotBytes, bytes - offset(k)); };
  // Rank p's chunk k lies at ring position start[p] + k; next[p] of them
  // are copied out.
  const std::vector<uint64_t> start = ringStarts();
  std::vector<uint64_t> next(ranks_, 0);
  // The chunks are not read again here: large calls bypass the cache on
  // the way out, so the rings stay in it.
  const bool streaming = bytes * ranks_ >= hostPathConfig(ctx.config()).streamingBytes;
  auto copyOut = [streaming](uint8_t* dst, const uint8_t* from, uint64_t len) {
    copyMaybeStreaming(dst, from, len, streaming);
  };
  // This rank's own part goes to its output from the ring too, while the
  // chunk is in cache (unless the output is the input).
  auto* own = static_cast<uint8_t*>(outs[ctx.rank()].data);
  uint64_t wrote = 0;
  drive(
      ctx, watch, seq, sig,
      [&] {
        bool moved = false;
        if (wrote < chunks && ringSlotFree(start[local_] + wrote)) {
          const uint64_t pos = start[local_] + wrote;
          ringPut(pos, src + offset(wrote), length(wrote));
          if (own != src) copyOut(own + offset(wrote), segment_.gatherSlot(local_, pos), length(wrote));
          ++wrote;
          moved = true;
        }
        bool all = wrote == chunks;
        for (int i = 1; i < ranks_; ++i) {
          const int p = (local_ + i) % ranks_;
          const uint64_t there = std::min(chunks, ringWritten(p) - start[p]);
          auto* dst = static_cast<uint8_t*>(outs[globalRank(host, p)].data);
          for (uint64_t& k = next[p]; k < there; ++k) {
            copyOut(dst + offset(k), segment_.gatherSlot(p, start[p] + k), length(k));
            ctl.gatherRead[local_].of[p].store(start[p] + k + 1, std::memory_order_release);
            moved = true;
          }
          all = all && next[p] == chunks;
        }
        if (moved) segment_.wakeAll();
        return all ? Turn::kDone : moved ? Turn::kMoved : Turn::kIdle;
      },
      [&] {  // for messages: the ranks whose chunks this rank waits for
        std::vector<int> ranks;
        for (int p = 0; p < ranks_; ++p) {
          if (p != local_ && next[p] < chunks) ranks.push_back(globalRank(host, p));
        }
        return ranks;
      });
  if (streaming) streamingFence();
}

}  // namespace smddp
