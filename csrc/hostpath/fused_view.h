// The calls of one fusion batch seen as a single buffer: element ranges of
// the fused buffer map onto pieces of the callers' tensors, so data is
// copied straight between the tensors and the segment's slots.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/call.h"
#include "hostpath/fusion_scheduler.h"
#include "reduce/stream_copy.h"

namespace smddp {

class FusedView {
 public:
  FusedView(const std::vector<AllreduceCall*>& calls, size_t elemSize) : es_(elemSize) {
    uint64_t off = 0;
    for (const AllreduceCall* c : calls) {
      for (const Buffer& b : c->bufs) {
        if (b.numel == 0) continue;
        parts_.push_back({static_cast<uint8_t*>(b.data), off, b.numel});
        off += b.numel;
      }
    }
  }
  // Copies elements [off, off + count) of the fused buffer to `dst`.
  void read(uint64_t off, uint64_t count, uint8_t* dst) const {
    visit(off, count, [&](uint8_t* p, uint64_t n) {
      std::memcpy(dst, p, n * es_);
      dst += n * es_;
    });
  }
  // The caller's own memory for elements [off, off + count) when they lie
  // in one tensor (a server reads its own part there, not from a slot);
  // nullptr when the range spans tensors.
  uint8_t* direct(uint64_t off, uint64_t count) const {
    uint8_t* out = nullptr;
    uint64_t pieces = 0;
    visit(off, count, [&](uint8_t* p, uint64_t) {
      out = p;
      ++pieces;
    });
    return pieces == 1 ? out : nullptr;
  }
  // Copies `src` over elements [off, off + count) of the fused buffer.
  void write(uint64_t off, uint64_t count, const uint8_t* src, bool streaming) const {
    visit(off, count, [&](uint8_t* p, uint64_t n) {
      copyMaybeStreaming(p, src, n * es_, streaming);
      src += n * es_;
    });
  }

 private:
  struct Part {
    uint8_t* data;
    uint64_t start;
    uint64_t numel;
  };
  template <typename F>
  void visit(uint64_t off, uint64_t count, F&& f) const {
    auto it = std::upper_bound(parts_.begin(), parts_.end(), off,
                               [](uint64_t o, const Part& p) { return o < p.start; });
    if (it != parts_.begin()) --it;
    while (count > 0 && it != parts_.end()) {
      uint64_t in = off - it->start;
      uint64_t n = std::min(count, it->numel - in);
      f(it->data + in * es_, n);
      off += n;
      count -= n;
      ++it;
    }
  }
  size_t es_;
  std::vector<Part> parts_;
};

}  // namespace smddp
