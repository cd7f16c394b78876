// ShardRing: the side of one network allreduce (algorithms/allreduce.cc)
// where this rank serves its own shard: peers' chunks of it land in a ring
// of slots and are reduced there. Shared by the all-to-all pattern and the
// pairwise rounds (rounds.h). Not the standalone reduction servers
// (server/): every rank of the network-only path serves its shard.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "engine/engine_context.h"
#include "engine/exchange.h"
#include "observe/stats.h"
#include "reduce/shard_plan.h"

namespace smddp {

// A reduction server's side of a call: peers' chunks of this rank's shard
// land in a small ring of slots per peer (ringDepth chunks each), so what
// arrives is still in cache when it is reduced. `chunkBytes(count)` is what
// a chunk of `count` elements takes on the wire. Once chunk k is in from
// every peer, `reduce(k, in)` runs with in[p] peer p's slot (in[rank] is
// null: the caller's own part) and returns the result's bytes; the ring
// counts its time as the server's, sends those bytes to every peer and
// re-arms the slots for chunk k + depth. In pairwise rounds the ring holds
// every chunk (depth = the shard's chunks) and hands each result to the
// caller instead (startInRounds).
class ShardRing {
 public:
  struct Result {
    const void* data;
    size_t bytes;
    uint64_t offset;  // the result's byte offset in the call, the send's tag
  };
  using Reduce = std::function<Result(size_t k, std::vector<const void*>& in)>;
  using ChunkBytes = std::function<size_t(uint64_t count)>;
  using ResultSink = std::function<void(size_t k)>;

  // Bytes of scratch the ring needs.
  static size_t scratchBytes(int n, size_t depth, size_t slotBytes) {
    return slotBytes * depth * n;
  }
  // `depth`: chunks per peer in flight (>= 1).
  ShardRing(EngineContext& ctx, Exchange& ex, const Shard& mine, size_t depth,
             uint8_t* scratch, size_t slotBytes, ChunkBytes chunkBytes, Reduce reduce)
      : ctx_(ctx), ex_(ex), mine_(mine), rank_(ctx.rank()), n_(ctx.size()), depth_(depth),
        base_(scratch), slotBytes_(slotBytes), chunkBytes_(std::move(chunkBytes)),
        reduce_(std::move(reduce)), remaining_(mine.chunks.size(), n_ - 1), in_(n_) {}

  // Posts the first `depth` chunks' receives (urgent: a server re-arming
  // its ring must never wait behind result receives).
  void start() {
    for (size_t k = 0; k < std::min(depth_, mine_.chunks.size()); ++k) {
      for (int p = 0; p < n_; ++p) {
        if (p != rank_) arm(p, k);
      }
    }
  }
  // Pairwise rounds: posts every chunk's receive, peer by peer in the
  // order they send to this rank (rank - 1 first); `sink(k)` takes chunk
  // k's result, in place in the caller's buffer, and sends it.
  void startInRounds(ResultSink sink, std::function<void(int peer)> arrived) {
    sink_ = std::move(sink);
    arrived_ = std::move(arrived);
    for (int r = 1; r < n_; ++r) {
      for (size_t k = 0; k < mine_.chunks.size(); ++k) arm((rank_ - r + n_) % n_, k);
    }
  }

 private:
  uint8_t* slot(int peer, size_t k) const {
    return base_ + slotBytes_ * (depth_ * peer + k % depth_);
  }
  void arm(int peer, size_t k) {
    const Chunk& c = mine_.chunks[k];
    ex_.recv(peer, kPhaseToServer, c.index, slot(peer, k), chunkBytes_(c.elemCount),
             [this, peer, k] {
               if (arrived_) arrived_(peer);
               if (--remaining_[k] == 0) reduceAndRearm(k);
             }, /*urgent=*/true);
  }
  void reduceAndRearm(size_t k) {
    for (int p = 0; p < n_; ++p) in_[p] = p == rank_ ? nullptr : slot(p, k);
    const Result res = ctx_.traffic().serverReduce([&] { return reduce_(k, in_); });
    if (sink_) {
      sink_(k);
      return;
    }
    const uint64_t index = mine_.chunks[k].index;
    for (int p = 0; p < n_; ++p) {
      if (p != rank_) ex_.send(p, kPhaseFromServer, index, res.offset, res.data, res.bytes);
    }
    if (k + depth_ < mine_.chunks.size()) {
      for (int p = 0; p < n_; ++p) {
        if (p != rank_) arm(p, k + depth_);
      }
    }
  }

  EngineContext& ctx_;
  Exchange& ex_;
  const Shard& mine_;
  const int rank_, n_;
  const size_t depth_;
  uint8_t* const base_;
  const size_t slotBytes_;
  const ChunkBytes chunkBytes_;
  const Reduce reduce_;
  ResultSink sink_;                // pairwise rounds: who sends the results
  std::function<void(int)> arrived_;  // pairwise rounds: a peer's chunk is in
  std::vector<int> remaining_;     // peers still to arrive, per chunk
  std::vector<const void*> in_;    // reused for every chunk
};

}  // namespace smddp
