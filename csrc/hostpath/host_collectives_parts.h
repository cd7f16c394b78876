// What the two halves of SegmentCollectives share (host_collectives.cc:
// opening, posting, waiting, all-gather; host_reduce_scatter.cc:
// reduce-scatter): internal to hostpath/, not an interface.
#pragma once

#include <cstdint>
#include <vector>

#include "algorithms/algorithms.h"
#include "engine/engine_context.h"
#include "hostpath/host_segment.h"

namespace smddp::hostcoll {

inline bool overlaps(const void* a, uint64_t aBytes, const void* b, uint64_t bBytes) {
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  return aBytes > 0 && bBytes > 0 && x < y + bBytes && y < x + aBytes;
}

// Whether `x` overlaps any of `bufs` (each of the two `bytes` long), but
// bufs[self] when it is `x` exactly: a rank's own part in place, which
// the kernels allow. The peers read `x` while this rank writes `bufs`
// (all-gather), or read `bufs` while it writes `x` (reduce-scatter).
inline bool clashes(const void* x, const std::vector<Buffer>& bufs, int self, uint64_t bytes) {
  for (size_t p = 0; p < bufs.size(); ++p) {
    if ((static_cast<int>(p) != self || bufs[p].data != x) && overlaps(x, bytes, bufs[p].data, bytes)) {
      return true;
    }
  }
  return false;
}

// Whether a reduce-scatter's post names each block's own address: up to
// kHostMaxRanks ranks. Past that it names where the first block lies,
// and the blocks must lie one after another.
inline bool postsEachBlock(int world) { return world <= kHostMaxRanks; }

inline uint64_t address(const void* p) { return reinterpret_cast<uint64_t>(p); }

// Notes the call's end when it leaves, however it leaves: the control
// plane then answers probes about it and refuses replayed error reports
// about it (an Exchange inside the call leaves that to the call).
class CallEnds {
 public:
  CallEnds(EngineContext& ctx, uint64_t seq, const CollectiveSignature& sig)
      : ctx_(ctx), seq_(seq), sig_(sig) {}
  ~CallEnds() {
    try {
      ctx_.control().noteSignature(seq_, sig_);
    } catch (...) {
    }
  }
  CallEnds(const CallEnds&) = delete;
  CallEnds& operator=(const CallEnds&) = delete;

 private:
  EngineContext& ctx_;
  const uint64_t seq_;
  const CollectiveSignature sig_;
};

// The chunks of `count` elements of `es` bytes that cross hosts.
inline std::vector<Chunk> crossChunks(const EngineContext& ctx, uint64_t count, size_t es) {
  return splitChunks(count, es, directChunkBytes(ctx));
}

// Whether the blocks lie one after another, each `bytes` long, from bufs[0].
inline bool contiguous(const std::vector<Buffer>& bufs, uint64_t bytes) {
  for (size_t i = 0; i < bufs.size(); ++i) {
    if (static_cast<const uint8_t*>(bufs[i].data) != static_cast<const uint8_t*>(bufs[0].data) + i * bytes) {
      return false;
    }
  }
  return true;
}

}  // namespace smddp::hostcoll
