// Reduce-scatter, reduce, gather, scatter and all-to-all: direct patterns on
// the same Exchange machinery as allreduce. A reducing rank ("server")
// receives each peer's block chunk by chunk into scratch and combines the
// blocks in rank order as soon as a chunk is complete, so the result is
// bitwise the same as allreduce's for the same inputs.

#include <cstring>

#include "common/error.h"
#include "algorithms/algorithms.h"
#include "engine/exchange.h"
#include "reduce/reduce_kernels.h"

namespace smddp {

namespace {

// Server half: receive `count` elements from every other rank and reduce
// them with `own` (this rank's contribution) into `out`, in rank order.
void serveReduction(Exchange& ex, EngineContext& ctx, CollectiveSignature sig,
                    const uint8_t* own, uint8_t* out, uint64_t count, std::vector<int>& remaining,
                    std::vector<Chunk>& chunks) {
  const int n = ctx.size();
  const int rank = ctx.rank();
  const size_t es = elementSize(sig.dtype);
  chunks = splitChunks(count, es, ctx.config().chunkBytes);
  uint8_t* scratch = ctx.scratch(count * es * n);
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
  for (size_t k = 0; k < chunks.size(); ++k) {
    const Chunk& c = chunks[k];
    for (int p = 0; p < n; ++p) {
      if (p == rank) continue;
      ex.recv(p, kPhaseToServer, c.index, slot(p) + c.elemOffset * es, c.elemCount * es,
              [&remaining, reduceChunk, k] {
                if (--remaining[k] == 0) reduceChunk(k);
              });
    }
  }
  if (n == 1) {
    for (size_t k = 0; k < chunks.size(); ++k) reduceChunk(k);
  }
}

// Worker half: send `count` elements at `src` to `server`, chunked.
void sendBlock(Exchange& ex, EngineContext& ctx, int server, const uint8_t* src, uint64_t count,
               size_t es, uint32_t phase = kPhaseToServer) {
  for (const Chunk& c : splitChunks(count, es, ctx.config().chunkBytes)) {
    ex.send(server, phase, c.index, c.elemOffset * es, src + c.elemOffset * es, c.elemCount * es);
  }
}

void recvBlock(Exchange& ex, EngineContext& ctx, int from, uint8_t* dst, uint64_t count,
               size_t es, uint32_t phase = kPhaseToServer) {
  for (const Chunk& c : splitChunks(count, es, ctx.config().chunkBytes)) {
    ex.recv(from, phase, c.index, dst + c.elemOffset * es, c.elemCount * es);
  }
}

void checkOp(const char* what, ReduceOp op, DataType dtype) {
  std::string why;
  SMDDP_CHECK(isSupported(op, dtype, &why), kInvalidArgument,
              std::string(what) + ": " + toString(op) + " on " + toString(dtype) + ": " + why);
}

}  // namespace

void runReduceScatter(EngineContext& ctx, uint64_t seq, const std::vector<Buffer>& ins,
                      Buffer out, DataType dtype, ReduceOp op) {
  checkOp("reduce_scatter", op, dtype);
  const int n = ctx.size();
  const size_t es = elementSize(dtype);
  SMDDP_CHECK(static_cast<int>(ins.size()) == n, kInvalidArgument,
              "reduce_scatter needs one input block per rank");
  CollectiveSignature sig{CollectiveType::kReduceScatter, dtype, op, out.numel, -1};
  Exchange ex(ctx, seq, sig);
  std::vector<int> remaining;
  std::vector<Chunk> chunks;
  // This rank serves block `rank`; every other block goes to its owner.
  serveReduction(ex, ctx, sig, static_cast<const uint8_t*>(ins[ctx.rank()].data),
                 static_cast<uint8_t*>(out.data), out.numel, remaining, chunks);
  for (int i = 1; i < n; ++i) {
    int p = (ctx.rank() + i) % n;
    sendBlock(ex, ctx, p, static_cast<const uint8_t*>(ins[p].data), out.numel, es);
  }
  ex.run();
}

void runReduce(EngineContext& ctx, uint64_t seq, Buffer buf, DataType dtype, ReduceOp op,
               int root) {
  checkOp("reduce", op, dtype);
  const size_t es = elementSize(dtype);
  CollectiveSignature sig{CollectiveType::kReduce, dtype, op, buf.numel, root};
  if (ctx.size() == 1) return;
  Exchange ex(ctx, seq, sig);
  std::vector<int> remaining;
  std::vector<Chunk> chunks;
  auto* data = static_cast<uint8_t*>(buf.data);
  if (ctx.rank() == root) {
    serveReduction(ex, ctx, sig, data, data, buf.numel, remaining, chunks);
  } else {
    sendBlock(ex, ctx, root, data, buf.numel, es);
  }
  ex.run();
}

void runGather(EngineContext& ctx, uint64_t seq, Buffer in, const std::vector<Buffer>& outs,
               DataType dtype, int root) {
  const size_t es = elementSize(dtype);
  CollectiveSignature sig{CollectiveType::kGather, dtype, ReduceOp::kSum, in.numel, root};
  if (ctx.rank() == root) {
    SMDDP_CHECK(static_cast<int>(outs.size()) == ctx.size(), kInvalidArgument,
                "gather needs one output per rank on the root");
    if (in.numel && outs[root].data != in.data) std::memmove(outs[root].data, in.data, in.numel * es);
  }
  if (ctx.size() == 1) return;
  Exchange ex(ctx, seq, sig);
  if (ctx.rank() == root) {
    for (int p = 0; p < ctx.size(); ++p) {
      if (p != root) recvBlock(ex, ctx, p, static_cast<uint8_t*>(outs[p].data), in.numel, es);
    }
  } else {
    sendBlock(ex, ctx, root, static_cast<const uint8_t*>(in.data), in.numel, es);
  }
  ex.run();
}

void runScatter(EngineContext& ctx, uint64_t seq, const std::vector<Buffer>& ins, Buffer out,
                DataType dtype, int root) {
  const size_t es = elementSize(dtype);
  CollectiveSignature sig{CollectiveType::kScatter, dtype, ReduceOp::kSum, out.numel, root};
  if (ctx.rank() == root) {
    SMDDP_CHECK(static_cast<int>(ins.size()) == ctx.size(), kInvalidArgument,
                "scatter needs one input per rank on the root");
    if (out.numel && ins[root].data != out.data) std::memmove(out.data, ins[root].data, out.numel * es);
  }
  if (ctx.size() == 1) return;
  Exchange ex(ctx, seq, sig);
  if (ctx.rank() == root) {
    for (int i = 1; i < ctx.size(); ++i) {
      int p = (root + i) % ctx.size();
      sendBlock(ex, ctx, p, static_cast<const uint8_t*>(ins[p].data), out.numel, es);
    }
  } else {
    recvBlock(ex, ctx, root, static_cast<uint8_t*>(out.data), out.numel, es);
  }
  ex.run();
}

void runAlltoall(EngineContext& ctx, uint64_t seq, const std::vector<Buffer>& ins,
                 const std::vector<Buffer>& outs, DataType dtype) {
  const int n = ctx.size();
  const int rank = ctx.rank();
  const size_t es = elementSize(dtype);
  SMDDP_CHECK(static_cast<int>(ins.size()) == n && static_cast<int>(outs.size()) == n,
              kInvalidArgument, "alltoall needs one input and one output per rank");
  // Split sizes may differ per pair, so the signature carries no count;
  // every frame's exact length is still checked against the receive.
  CollectiveSignature sig{CollectiveType::kAlltoall, dtype, ReduceOp::kSum, 0, -1};
  SMDDP_CHECK(ins[rank].numel == outs[rank].numel, kInvalidArgument,
              "alltoall: this rank sends itself " + std::to_string(ins[rank].numel) +
                  " elements but expects " + std::to_string(outs[rank].numel));
  if (ins[rank].numel && ins[rank].data != outs[rank].data) {
    std::memmove(outs[rank].data, ins[rank].data, ins[rank].numel * es);
  }
  if (n == 1) return;
  Exchange ex(ctx, seq, sig);
  for (int i = 1; i < n; ++i) {
    int p = (rank + n - i) % n;
    recvBlock(ex, ctx, p, static_cast<uint8_t*>(outs[p].data), outs[p].numel, es);
  }
  for (int i = 1; i < n; ++i) {
    int p = (rank + i) % n;
    sendBlock(ex, ctx, p, static_cast<const uint8_t*>(ins[p].data), ins[p].numel, es);
  }
  ex.run();
}

}  // namespace smddp
