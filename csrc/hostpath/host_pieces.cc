// SegmentCollectives' entry points (host_collectives.h): a call runs as one
// step, or on one host, when it would stage more than SMDDP_STAGE_BYTES
// of private input in the pool, as steps of a piece each, one after
// another. Each piece is staged and read as a whole call is, so the pool
// range a rank keeps for staging stays bounded, and the peers still read
// every piece in place (docs/design.md, "Buffers from the backend: the
// shared pool"). Every rank cuts the call alike: the cut depends on the
// call only, and each piece posts the call's own signature, so a rank
// that made another call fails at the first piece. The pieces share the
// call's StallWatch: together they wait no longer than the group timeout.
#include <algorithm>
#include <cstring>
#include <vector>

#include "algorithms/blocks.h"
#include "common/error.h"
#include "engine/engine_context.h"
#include "engine/stall_watch.h"
#include "hostpath/host_collectives.h"
#include "hostpath/host_collectives_parts.h"

namespace smddp {

using namespace hostcoll;

namespace {

// Resets the step counter when the call leaves, however it leaves, and
// frees the copy of an input that overlapped an output (a rare call's,
// as large as the call).
class PieceSteps {
 public:
  PieceSteps(uint64_t& piece, std::vector<uint8_t>& copy) : piece_(piece), copy_(copy) {
    piece_ = 0;
  }
  ~PieceSteps() {
    piece_ = 0;
    std::vector<uint8_t>().swap(copy_);
  }
  PieceSteps(const PieceSteps&) = delete;
  PieceSteps& operator=(const PieceSteps&) = delete;
  void next() { ++piece_; }

 private:
  uint64_t& piece_;
  std::vector<uint8_t>& copy_;
};

Buffer slice(const void* base, uint64_t offset, uint64_t numel, size_t es,
             bool hugePages = false) {
  return Buffer{const_cast<uint8_t*>(static_cast<const uint8_t*>(base)) + offset * es, numel,
                hugePages};
}

}  // namespace

uint64_t SegmentCollectives::pieceElems(const EngineContext& ctx, uint64_t numel, size_t es,
                                        uint64_t copies) const {
  const uint64_t limit = hostPathConfig(ctx.config()).stageBytes;
  if (hosts() != 1 || ranks_ == 1 || limit == 0 || copies == 0 || numel * es * copies <= limit) {
    return 0;
  }
  const uint64_t elems = std::max<uint64_t>(1, limit / (es * copies));
  // At most 2^kPieceShift pieces (flagOf): past that a piece is larger than
  // the limit, and the peers read it where it lies.
  const uint64_t most = uint64_t{1} << kPieceShift;
  return std::max(elems, (numel + most - 1) / most);
}

void SegmentCollectives::allGather(EngineContext& ctx, uint64_t seq, Buffer in,
                                   const std::vector<Buffer>& outs, DataType dtype) {
  SMDDP_CHECK(static_cast<int>(outs.size()) == ctx.size(), kInvalidArgument,
              "allgather needs one output per rank");
  const CollectiveSignature sig{CollectiveType::kAllgather, dtype, ReduceOp::kSum, in.numel, -1};
  const CallEnds ends(ctx, seq, sig);
  StallWatch watch(ctx, sig, seq, ctx.waits().timeout());
  const size_t es = elementSize(dtype);
  const uint64_t step = pieceElems(ctx, in.numel, es, 1);
  if (step == 0) {
    gatherStep(ctx, watch, seq, sig, in, outs);
    return;
  }
  // A piece's outputs are written before the next piece is read: an input
  // that overlaps another rank's output is read from a copy made first.
  const uint64_t bytes = in.numel * es;
  PieceSteps steps(piece_, wholeCopy_);
  const void* src = in.data;
  if (clashes(src, outs, ctx.rank(), bytes)) {
    wholeCopy_.assign(static_cast<const uint8_t*>(in.data), static_cast<const uint8_t*>(in.data) + bytes);
    src = wholeCopy_.data();
  }
  std::vector<Buffer> part(outs.size());
  for (uint64_t off = 0; off < in.numel; off += step, steps.next()) {
    const uint64_t n = std::min(step, in.numel - off);
    for (size_t p = 0; p < outs.size(); ++p) part[p] = slice(outs[p].data, off, n, es);
    // Every rank cuts alike (pieceElems); whether a piece is staged or
    // read in place is each poster's own choice (readsInPlace).
    gatherStep(ctx, watch, seq, sig, slice(src, off, n, es, in.hugePages && src == in.data),
               part);
  }
}

void SegmentCollectives::reduceScatter(EngineContext& ctx, uint64_t seq,
                                       const std::vector<Buffer>& ins, Buffer out, DataType dtype,
                                       ReduceOp op) {
  checkOp("reduce_scatter", op, dtype);
  const int world = ctx.size();
  SMDDP_CHECK(static_cast<int>(ins.size()) == world, kInvalidArgument,
              "reduce_scatter needs one input block per rank");
  const CollectiveSignature sig{CollectiveType::kReduceScatter, dtype, op, out.numel, -1};
  const CallEnds ends(ctx, seq, sig);
  StallWatch watch(ctx, sig, seq, ctx.waits().timeout());
  const size_t es = elementSize(dtype);
  // Staging copies the blocks of the ranks-1 peers, and only where a post
  // names each block (one address for all would not survive the cut).
  const uint64_t step = postsEachBlock(world)
                            ? pieceElems(ctx, out.numel, es, static_cast<uint64_t>(ranks_ - 1))
                            : 0;
  if (step == 0) {
    scatterStep(ctx, watch, seq, sig, ins, out);
    return;
  }
  // `out` is written a piece at a time before the next is read: blocks it
  // overlaps (but this rank's own, exactly) are read from copies made first.
  const uint64_t bytes = out.numel * es;
  PieceSteps steps(piece_, wholeCopy_);
  std::vector<const void*> block(world);
  for (int p = 0; p < world; ++p) block[p] = ins[p].data;
  if (clashes(out.data, ins, ctx.rank(), bytes)) {
    wholeCopy_.resize(bytes * world);
    for (int p = 0; p < world; ++p) {
      std::memcpy(wholeCopy_.data() + p * bytes, ins[p].data, bytes);
      block[p] = wholeCopy_.data() + p * bytes;
    }
  }
  std::vector<Buffer> part(world);
  for (uint64_t off = 0; off < out.numel; off += step, steps.next()) {
    const uint64_t n = std::min(step, out.numel - off);
    for (int p = 0; p < world; ++p) part[p] = slice(block[p], off, n, es);
    scatterStep(ctx, watch, seq, sig, part, slice(out.data, off, n, es));
  }
}

}  // namespace smddp
