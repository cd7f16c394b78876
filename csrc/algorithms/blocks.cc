// The block exchanges the direct collectives share (blocks.h).

#include "algorithms/blocks.h"

#include "common/error.h"
#include "reduce/reduce_kernels.h"

namespace smddp {

// Server half: receive `count` elements from every other rank and reduce
// them with `own` (this rank's contribution) into `out`, in rank order.
void serveReduction(Exchange& ex, EngineContext& ctx, CollectiveSignature sig,
                    const uint8_t* own, uint8_t* out, uint64_t count, std::vector<int>& remaining,
                    std::vector<Chunk>& chunks, const std::function<void()>& onArrive) {
  const int n = ctx.size();
  const int rank = ctx.rank();
  const size_t es = elementSize(sig.dtype);
  chunks = splitChunks(count, es, directChunkBytes(ctx));
  uint8_t* scratch = ctx.memory().scratch(count * es * n);
  remaining.assign(chunks.size(), n - 1);
  auto slot = [=](int p) { return scratch + count * es * p; };
  // Runs later, from run()'s completions: capture locals by value; the
  // caller's `chunks` outlives run().
  auto reduceChunk = [=, &chunks](size_t k) {
    const Chunk& c = chunks[k];
    size_t off = c.elemOffset * es;
    std::vector<const void*> inputs(n);
    for (int p = 0; p < n; ++p) inputs[p] = p == rank ? own + off : slot(p) + off;
    reduceOrdered(out + off, inputs.data(), n, c.elemCount, sig.dtype, sig.op, n);
  };
  for (int r = 1; r < n; ++r) {
    const int p = (rank - r + n) % n;
    for (size_t k = 0; k < chunks.size(); ++k) {
      const Chunk& c = chunks[k];
      ex.recv(p, kPhaseToServer, c.index, slot(p) + c.elemOffset * es, c.elemCount * es,
              [&remaining, reduceChunk, k, onArrive] {
                if (--remaining[k] == 0) reduceChunk(k);
                if (onArrive) onArrive();
              });
    }
  }
  if (n == 1) {
    for (size_t k = 0; k < chunks.size(); ++k) reduceChunk(k);
  }
}

// Worker half: send `count` elements at `src` to `server`, chunked.
void sendBlock(Exchange& ex, EngineContext& ctx, int server, const uint8_t* src, uint64_t count,
               size_t es, uint32_t phase) {
  for (const Chunk& c : splitChunks(count, es, directChunkBytes(ctx))) {
    ex.send(server, phase, c.index, c.elemOffset * es, src + c.elemOffset * es, c.elemCount * es);
  }
}

void recvBlock(Exchange& ex, EngineContext& ctx, int from, uint8_t* dst, uint64_t count,
               size_t es, uint32_t phase) {
  for (const Chunk& c : splitChunks(count, es, directChunkBytes(ctx))) {
    ex.recv(from, phase, c.index, dst + c.elemOffset * es, c.elemCount * es);
  }
}

void checkOp(const char* what, ReduceOp op, DataType dtype) {
  std::string why;
  SMDDP_CHECK(isSupported(op, dtype, &why), kInvalidArgument,
              std::string(what) + ": " + toString(op) + " on " + toString(dtype) + ": " + why);
}

}  // namespace smddp
