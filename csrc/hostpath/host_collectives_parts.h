// What the two halves of SegmentCollectives share (host_collectives.cc:
// opening, posting, waiting, all-gather; host_reduce_scatter.cc:
// reduce-scatter): internal to hostpath/, not an interface.
#pragma once

#include <cstdint>
#include <vector>

#include "algorithms/algorithms.h"
#include "engine/engine_context.h"

namespace smddp::hostcoll {

inline bool overlaps(const void* a, uint64_t aBytes, const void* b, uint64_t bBytes) {
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  return aBytes > 0 && bBytes > 0 && x < y + bBytes && y < x + aBytes;
}

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
