// SegmentCollectives' reduce-scatter (host_collectives.h): through the host
// segment on one host; across hosts, host sums combined through the
// segment, crossing once, added in host order.
#include "hostpath/host_collectives.h"

#include <algorithm>
#include <cstring>

#include "algorithms/blocks.h"
#include "algorithms/rounds.h"
#include "common/error.h"
#include "engine/exchange.h"
#include "engine/stall_watch.h"
#include "hostpath/host_collectives_parts.h"
#include "reduce/narrow_wire.h"
#include "reduce/reduce_kernels.h"
#include "reduce/stream_copy.h"

namespace smddp {

using namespace hostcoll;

namespace {

// Reduce-scatter reads the peers' parts in pieces of this many bytes, which
// stay in cache until the combine reads them.
constexpr uint64_t kPieceBytes = 256 * 1024;

}  // namespace

template <typename Remote, typename Poll>
void SegmentCollectives::combineHost(const uint8_t* own, const Remote& remote, uint8_t* dst,
                                     uint64_t numel, DataType dtype, ReduceOp op,
                                     double avgDivisor, const StallWatch& watch,
                                     const Poll& poll) {
  const size_t es = elementSize(dtype);
  const uint64_t pieceElems = std::max<uint64_t>(1, kPieceBytes / es);
  pieces_.resize(pieceElems * es * ranks_);
  std::vector<const void*> inputs(ranks_);
  for (uint64_t off = 0; off < numel; off += pieceElems) {
    const uint64_t len = std::min(pieceElems, numel - off);
    for (int p = 0; p < ranks_; ++p) {
      if (p == local_) {
        inputs[p] = own + off * es;
        continue;
      }
      // A block in the peer's pool is combined where it lies; any other
      // is read into a piece first.
      if (const uint8_t* at = mapped(p, remote(p) + off * es, len * es)) {
        inputs[p] = at;
        continue;
      }
      uint8_t* piece = pieces_.data() + p * pieceElems * es;
      read(p, piece, remote(p) + off * es, len * es, watch);
      inputs[p] = piece;
    }
    reduceOrdered(dst + off * es, inputs.data(), ranks_, len, dtype, op, avgDivisor);
    poll();
  }
}

void SegmentCollectives::scatterStep(EngineContext& ctx, StallWatch& watch, uint64_t seq,
                                     const CollectiveSignature& sig,
                                     const std::vector<Buffer>& ins, Buffer out) {
  const int world = ctx.size();
  const int me = ctx.rank();
  const DataType dtype = sig.dtype;
  const ReduceOp op = sig.op;
  const uint64_t bytes = out.numel * elementSize(dtype);
  // The peers read every block but this rank's own while this rank writes
  // `out`; `out` may be its own block exactly (the kernel allows it). Past
  // kHostMaxRanks ranks a post names where the first block lies, and the
  // blocks must lie one after another: the peers read a copy otherwise.
  const bool perBlock = postsEachBlock(world);
  const bool clash = (!perBlock && !contiguous(ins, bytes)) || clashes(out.data, ins, me, bytes);
  claimSlot(ctx, watch, seq, sig, 0);
  const StepLeft left(*this, seq);
  std::vector<const uint8_t*> block(world);
  for (int p = 0; p < world; ++p) block[p] = static_cast<const uint8_t*>(ins[p].data);
  // Staged before `out` is written: a staged block is already a stable
  // copy, so a clash snapshots only the blocks left where they were.
  if (perBlock) stageForPeers(block, bytes, hostPathConfig(ctx.config()));
  if (clash) {
    snapshot_.resize(bytes * world);
    for (int p = 0; p < world; ++p) {
      if (block[p] != ins[p].data) continue;
      if (bytes) std::memcpy(snapshot_.data() + p * bytes, ins[p].data, bytes);
      block[p] = snapshot_.data() + p * bytes;
    }
  }
  std::vector<uint64_t> posted(perBlock ? world : 1);
  for (size_t p = 0; p < posted.size(); ++p) posted[p] = address(block[p]);
  post(seq, sig, posted);
  awaitPosts(ctx, watch, seq, sig);
  // Where local rank p's block for group rank `owner` lies in p's memory.
  const RemoteBlocks remote{segment_.ctl().direct[slot_], perBlock, bytes};
  if (hosts() == 1) {
    combineHost(block[me], remote.of(me), static_cast<uint8_t*>(out.data), out.numel, dtype, op,
                world, watch, [] {});
  } else {
    reduceAcrossHosts(ctx, seq, sig, block, remote, out, watch);
  }
  markDone(seq);
  awaitDone(ctx, watch, seq, sig, flagOf(seq));
}

void SegmentCollectives::stageForPeers(std::vector<const uint8_t*>& block, uint64_t bytes,
                                       const HostPathConfig& cfg) {
  // Measured in turns on blocks the poster had just written (as backward
  // writes gradients), against the same calls read with process_vm_readv:
  // 2.0-3.4x faster from 256 KiB to 4 MiB at world 4, 1.7x at 16 MiB,
  // 1.05-1.36x at world 2 (docs/notes/2026-12-06-staging.md). Which
  // stores: stageStreaming.
  if (ranks_ == 1 || bytes == 0) return;
  const PoolWhere pool = SharedPool::where();
  // The owners whose blocks the peers read, outside the pool.
  std::vector<int>& read = stagedOwners_;
  read.clear();
  for (int h = 0; h < hosts(); ++h) {
    for (int q = 0; q < ranks_; ++q) {
      const int owner = globalRank(h, q);
      if (q != local_ && !pool.contains(address(block[owner]), bytes)) read.push_back(owner);
    }
  }
  const uint64_t staged = bytes * read.size();
  if (read.empty() || staged > cfg.stageBytes) return;
  uint8_t* at = stageRange(staged, 0);
  if (!at) return;
  const bool streaming = stageStreaming(staged, cfg);
  for (int p : read) {
    copyMaybeStreaming(at, block[p], bytes, streaming);
    block[p] = at;
    at += bytes;
  }
  if (streaming) streamingFence();
}

void SegmentCollectives::reduceAcrossHosts(EngineContext& ctx, uint64_t seq,
                                           const CollectiveSignature& sig,
                                           const std::vector<const uint8_t*>& block,
                                           const RemoteBlocks& remote, Buffer out,
                                           StallWatch& watch) {
  // This host's sum of each block owned by this rank's local index goes to
  // its owner a chunk at a time, each chunk sent as soon as it is combined
  // (this rank's own block last), in the wire form of SMDDP_CROSS_HOST_DTYPE
  // where it narrows (each chunk its own piece, with its own scale);
  // averaging divides once, at the end.
  const int H = hosts();
  const int host = topo_.hostIndex;
  const DataType dtype = sig.dtype;
  const ReduceOp op = sig.op;
  const uint64_t count = out.numel;
  const size_t es = elementSize(dtype);
  const CrossForm form{crossingWire(dtype, op), dtype};
  const DataType wire = form.wire;
  const bool narrow = form.narrow();
  const std::vector<Chunk> chunks = crossChunks(ctx, count, es);
  auto wireAt = [&form](const Chunk& c) { return form.at(c); };
  auto wireLen = [&form](const Chunk& c) { return form.length(c); };
  const uint64_t wireBytes = wireAt(chunks.back()) + wireLen(chunks.back());
  const ReduceOp hostOp = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  hostSums_.resize(narrow ? count * es : wireBytes * H);
  packed_.resize(narrow ? wireBytes * H : 0);
  arrived_.resize(wireBytes * H);
  std::vector<float> scratch(narrow ? std::min<uint64_t>(count, kNarrowWireScratch) : 0);
  // What this host sends (or keeps) for host h.
  auto piece = [&](int h) { return (narrow ? packed_.data() : hostSums_.data()) + h * wireBytes; };
  Exchange ex(ctx, seq, sig, std::chrono::milliseconds(0), Exchange::CallEnd::kLater);
  // In rounds, round k sends host + k its sums while host - k's come in.
  RoundSends sends(ctx, ex, inRounds(count * es * ctx.size()), directChunkBytes(ctx));
  for (int k = 1; k < H; ++k) {
    const int h = (host - k + H) % H;
    for (const Chunk& c : chunks) {
      ex.recv(globalRank(h, local_), kPhaseToServer, c.index,
              arrived_.data() + h * wireBytes + wireAt(c), wireLen(c), sends.onArrive());
    }
  }
  for (int k = 1; k <= H; ++k) {
    const int h = (host + k) % H;
    const int owner = globalRank(h, local_);
    for (const Chunk& c : chunks) {
      const uint64_t off = c.elemOffset * es;
      uint8_t* sum = (narrow ? hostSums_.data() : piece(h)) + off;
      const auto at = remote.of(owner);
      combineHost(block[owner] + off, [&at, off](int p) { return at(p) + off; }, sum,
                  c.elemCount, dtype, hostOp, 1.0, watch, [&ex] { ex.poll(); });
      // Every host's sum is rounded once, this host's own too.
      if (narrow) {
        packNarrowWire(piece(h) + wireAt(c), reinterpret_cast<const float*>(sum), c.elemCount,
                       wire, scratch.data());
      }
      if (h == host) continue;
      sends.send(owner, kPhaseToServer, c.index, wireAt(c), piece(h) + wireAt(c), wireLen(c));
      ex.poll();
    }
  }
  markDone(seq);
  ex.run();
  std::vector<const uint8_t*> inputs(H);
  for (int h = 0; h < H; ++h) inputs[h] = h == host ? piece(h) : arrived_.data() + h * wireBytes;
  addHostSums(inputs, chunks, form, out, op, ctx.size());
}

void SegmentCollectives::addHostSums(const std::vector<const uint8_t*>& inputs,
                                     const std::vector<Chunk>& chunks, const CrossForm& form,
                                     Buffer out, ReduceOp op, int world) const {
  const int H = static_cast<int>(inputs.size());
  if (out.numel == 0) return;
  if (!form.narrow()) {
    std::vector<const void*> all(inputs.begin(), inputs.end());
    reduceOrdered(out.data, all.data(), H, out.numel, form.dtype, op, world);
    return;
  }
  const DataType wire = form.wire;
  uint64_t longest = 0;
  for (const Chunk& c : chunks) longest = std::max<uint64_t>(longest, c.elemCount);
  std::vector<float> wide(H * longest);
  std::vector<const void*> at(H);
  auto* dst = static_cast<float*>(out.data);
  for (const Chunk& c : chunks) {
    for (int h = 0; h < H; ++h) at[h] = inputs[h] + form.at(c);
    const int bad = reduceNarrowWire(dst + c.elemOffset, at.data(), H, c.elemCount, wire, op,
                                     world, wide.data());
    if (bad >= 0) {
      throwInvalidWireScale(wire, "the host sum from host " + std::to_string(bad) + " (rank " +
                                      std::to_string(globalRank(bad, local_)) + ")");
    }
  }
}

uint64_t SegmentCollectives::CrossForm::at(const Chunk& c) const {
  return narrow() ? c.index * kNarrowWireScaleBytes + c.elemOffset * elementSize(wire)
                  : c.elemOffset * elementSize(dtype);
}

uint64_t SegmentCollectives::CrossForm::length(const Chunk& c) const {
  return narrow() ? narrowWireBytes(c.elemCount, wire) : c.elemCount * elementSize(dtype);
}

DataType SegmentCollectives::crossingWire(DataType dtype, ReduceOp op) const {
  const bool sums = op == ReduceOp::kSum || op == ReduceOp::kAvg;
  return dtype == DataType::kFloat32 && sums ? crossHostDtype_ : dtype;
}

}  // namespace smddp
