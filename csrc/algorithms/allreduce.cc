// Allreduce through reduction servers (docs/design.md, "The allreduce path").
//
// Every rank hosts one server (or SMDDP_SERVERS_PER_NODE ranks per host
// do: PeerTable::networkServers). The buffer is cut into one shard per server
// (or goes whole to one server when small). Each rank sends shard s to
// server s; server s waits for shard s from every rank, combines them in rank
// order (bitwise reproducible), and returns the result to every rank. Shards
// are pipelined in chunks so sending, reducing and returning overlap.
// Bytes on the wire per rank: 2 * (n-1)/n * N, in two network steps.

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <optional>
#include <sstream>

#include "common/error.h"
#include "common/param.h"
#include "algorithms/algorithms.h"
#include "algorithms/algorithms_config.h"
#include "algorithms/rounds.h"
#include "algorithms/shard_ring.h"
#include "engine/exchange.h"
#include "engine/peer_table.h"
#include "reduce/narrow_wire.h"
#include "reduce/reduce_kernels.h"
#include "reduce/shard_plan.h"

namespace smddp {

SMDDP_PARAM_BYTES(paramMinShardBytes, "SMDDP_MIN_SHARD_BYTES", 16384, 1, 1LL << 30,
                  "a call smaller than servers x this goes whole to one server (round-robin)")
SMDDP_PARAM_BYTES(paramMinChunkBytes, "SMDDP_MIN_CHUNK_BYTES", 131072, 4096, 1LL << 30,
                  "smallest chunk on the wire the network path cuts a shard into, when the "
                  "shard is short of 16 chunks of SMDDP_CHUNK_BYTES")
SMDDP_PARAM_INT(paramRingDepth, "SMDDP_RING_DEPTH", 0, 0, 1024,
                "chunks per peer a reduction server keeps in flight (cache-resident receive "
                "ring; 0: 4, or 2 when the group spans hosts)")

SMDDP_PARAM_INT(paramRoundsMinHosts, "SMDDP_ROUNDS_MIN_HOSTS", 3, 0, 1 << 20,
                "on the network-only path of a group with one rank per host, calls of "
                "SMDDP_ROUNDS_MIN_BYTES and up run in pairwise rounds (one flow per link "
                "direction) from this many hosts (0: never; fewer than 3: 3)")
SMDDP_PARAM_BYTES(paramRoundsMinBytes, "SMDDP_ROUNDS_MIN_BYTES", 4194304, 1, 1LL << 40,
                  "smallest call that runs in pairwise rounds (SMDDP_ROUNDS_MIN_HOSTS)")

SMDDP_PARAM_BYTES(paramFusionBytes, "SMDDP_FUSION_BUFFER_BYTES", 33554432, 0, 1LL << 34,
                  "queued allreduce calls are fused up to this many bytes (0: no fusion)")

void readAllreduceParams(EngineConfig& c) {
  AlgorithmsConfig a;
  a.minShardBytes = static_cast<uint64_t>(paramMinShardBytes());
  a.minChunkBytes = static_cast<uint64_t>(paramMinChunkBytes());
  a.ringDepth = paramRingDepth();
  a.roundsMinHosts = paramRoundsMinHosts();
  a.roundsMinBytes = static_cast<uint64_t>(paramRoundsMinBytes());
  a.fusionBytes = static_cast<uint64_t>(paramFusionBytes());
  c.layers.set(a);
}


namespace {

// Calls send(shard, k) for chunk k < `upTo` of every shard that another
// rank serves, in the order this rank sends them: chunk by chunk across the
// servers, so that all of them can start reducing at once, and from a
// different server on each rank, so that rank 0 does not reach every server
// first.
template <typename SendFn>
void forEachChunkOut(const ShardPlan& plan, const std::vector<int>& servers, int rank,
                     SendFn&& send, size_t upTo = SIZE_MAX) {
  const int S = static_cast<int>(servers.size());
  size_t maxChunks = 0;
  for (const Shard& s : plan.shards()) maxChunks = std::max(maxChunks, s.chunks.size());
  for (size_t k = 0; k < std::min(maxChunks, upTo); ++k) {
    for (int i = 1; i < S + 1; ++i) {
      const Shard* s = plan.shardFor((rank + i) % S);
      if (!s || servers[s->server] == rank || k >= s->chunks.size()) continue;
      send(*s, k);
    }
  }
}

// Worker side: receive every other server's result into place, then send
// every other server its shard.
void postWorkerSide(Exchange& ex, const ShardPlan& plan, const std::vector<int>& servers, int rank,
                    uint8_t* data, size_t es) {
  for (const Shard& s : plan.shards()) {
    const int server = servers[s.server];
    if (server == rank) continue;
    for (const Chunk& c : s.chunks) {
      ex.recv(server, kPhaseFromServer, c.index, data + c.elemOffset * es, c.elemCount * es);
    }
  }
  forEachChunkOut(plan, servers, rank, [&](const Shard& s, size_t k) {
    const Chunk& c = s.chunks[k];
    ex.send(servers[s.server], kPhaseToServer, c.index, c.elemOffset * es,
            data + c.elemOffset * es, c.elemCount * es);
  });
}

// What both cores derive from a call: the chunk size, the shard plan and
// this rank's shard in it (null: it serves none). `wireElemSize` is an
// element's size on the wire (the narrow core's wire form).
struct CallPlan {
  CallPlan(const EngineContext& ctx, const CollectiveSignature& sig, uint64_t planSeq,
           size_t wireElemSize) {
    const std::vector<int>& servers = ctx.peers().networkServers();
    const int S = static_cast<int>(servers.size());
    int myServer = -1;
    for (int i = 0; i < S; ++i) {
      if (servers[i] == ctx.rank()) myServer = i;
    }
    const size_t es = elementSize(sig.dtype);
    const EngineConfig& config = ctx.config();
    const uint64_t shardElems = sig.numel / S + 1;
    chunkBytes = effectiveChunkBytes(
        shardElems, es,
        shardChunkBytes(shardElems, es, wireElemSize, config.chunkBytes,
                        algorithmsConfig(config).minChunkBytes));
    rounds = wireElemSize == es && inRounds(ctx, sig.numel * es);
    if (rounds) {
      // Every receive of the call is posted at once, (n - 1) peers' data
      // and their results, within the cap on posted receives: the peers
      // send strictly in order, and a receive held back could stall them.
      const uint64_t perShard = std::max<uint64_t>(
          1, static_cast<uint64_t>(config.maxPostedRecvs) / (2 * static_cast<uint64_t>(S - 1)));
      chunkBytes = std::max<uint64_t>(chunkBytes, (shardElems + perShard - 1) / perShard * es);
    }
    plan = ShardPlan::make(sig.numel, es, S, planSeq, algorithmsConfig(config).minShardBytes,
                           chunkBytes);
    mine = myServer >= 0 ? plan.shardFor(myServer) : nullptr;
    if (plan.shards().size() != static_cast<size_t>(S) || !mine) rounds = false;
    for (const Shard& s : plan.shards()) {
      if (rounds && s.chunks.size() != plan.shards()[0].chunks.size()) rounds = false;
    }
  }
  // Pairwise rounds (OrderedSends, postInRounds): every rank a server on
  // its own host, SMDDP_ROUNDS_MIN_HOSTS of them or more, a call of
  // SMDDP_ROUNDS_MIN_BYTES up to kRoundsMaxBytes.
  static bool inRounds(const EngineContext& ctx, uint64_t bytes) {
    return roundsFor(ctx, bytes) &&
           static_cast<int>(ctx.peers().networkServers().size()) == ctx.size() &&
           bytes <= kRoundsMaxBytes;
  }
  // A server in pairwise rounds holds every peer's contribution to its
  // shard until the last round: scratch about the call's size. Bigger
  // calls take the all-to-all pattern, whose ring holds a few chunks.
  static constexpr uint64_t kRoundsMaxBytes = uint64_t{256} << 20;
  CallPlan(const CallPlan&) = delete;  // `mine` points into `plan`
  CallPlan& operator=(const CallPlan&) = delete;

  uint64_t chunkBytes = 0;
  ShardPlan plan;
  const Shard* mine = nullptr;
  bool rounds = false;  // the call runs in pairwise rounds
};

void allreduceCore(EngineContext& ctx, uint64_t seq, const CollectiveSignature& sig,
                   uint8_t* data, uint64_t planSeq, std::chrono::milliseconds timeout,
                   const ExtraMessages& extra = nullptr) {
  const int rank = ctx.rank();
  const int n = ctx.size();
  const size_t es = elementSize(sig.dtype);
  const CallPlan cp(ctx, sig, planSeq, es);
  Exchange ex(ctx, seq, sig, timeout);

  // Server side: the reduction goes straight into this rank's own buffer
  // and is sent from there: no staging copy on the way in or out.
  // In pairwise rounds the ring holds every chunk of the shard.
  std::optional<ShardRing> server;
  if (cp.mine && n > 1) {
    const size_t depth = cp.rounds ? cp.mine->chunks.size()
                                   : static_cast<size_t>(ringDepthFor(ctx.config(), ctx.peers().oneHost()));
    uint8_t* scratch = ctx.memory().scratch(ShardRing::scratchBytes(n, depth, cp.chunkBytes));
    server.emplace(ctx, ex, *cp.mine, depth, scratch, cp.chunkBytes,
                   [es](uint64_t count) { return count * es; },
                   [&](size_t k, std::vector<const void*>& in) {
                     const Chunk& c = cp.mine->chunks[k];
                     uint8_t* own = data + c.elemOffset * es;
                     in[rank] = own;
                     reduceOrdered(own, in.data(), n, c.elemCount, sig.dtype, sig.op, n);
                     return ShardRing::Result{own, c.elemCount * es, c.elemOffset * es};
                   });
  }

  // Receives first (so frames land in place), then sends.
  std::optional<OrderedSends> rounds;
  if (cp.rounds) {
    ctx.traffic().pairwiseRounds();
    rounds.emplace(ex, roundsWindow(cp.chunkBytes), cp.mine->chunks.size());
    postInRounds(ex, cp.plan, ctx.peers().networkServers(), rank, n, data, es, *rounds);
    server->startInRounds([&](size_t k) { rounds->release(k); },
                          [&](int) { rounds->arrive(OrderedSends::kData); });
    rounds->pump();
  } else {
    if (server) server->start();
    postWorkerSide(ex, cp.plan, ctx.peers().networkServers(), rank, data, es);
  }
  if (extra) extra(ex);
  ex.run();
}

// allreduceCore with every chunk crossing in SMDDP_CROSS_HOST_DTYPE's
// wire form (reduce/narrow_wire.h): the network-only path of a group with
// one rank per host (narrowsOnNetwork). Each rank packs the chunks it sends;
// server s widens the n contributions to a chunk of its shard (its own
// rounded through the wire form too, so every contribution is rounded once
// whichever rank serves it), sums them in f32 in rank order, packs the
// result once and sends those bytes; every rank, the server itself
// included, reads the result from the same bytes. The hierarchical path's
// CrossHost::postNarrow does the same between host servers.
//
// The wire forms live in small rings, kNarrowWindow chunks per server each
// way, so they stay in cache: chunk k + window to a server is packed once
// chunk k's send to it completed, and its result received once chunk k's
// was unpacked. (A slot per chunk of a 64 MiB call, packed all at once
// before any progress, reached 158-164% of the f32 link bound at 4 x 1
// hosts, against 190% at 16 MiB.)
constexpr size_t kNarrowWindow = 8;

// Where allreduceCoreNarrow's wire slots lie in the call's scratch: per
// server a ring of kNarrowWindow going out and as many coming back; a slot
// per chunk of this rank's own shard (its result, sent to every peer); the
// server's receive ring (at ringAt); then f32 room to scale one chunk and
// widen n contributions (`wide`, n + 1 chunks).
struct NarrowScratch {
  uint8_t* base = nullptr;
  size_t slot = 0;
  size_t servers = 0;
  size_t ringAt = 0;
  float* wide = nullptr;

  NarrowScratch(EngineContext& ctx, const CallPlan& cp, size_t depth, DataType wire) {
    uint64_t maxChunk = 0;
    for (const Shard& s : cp.plan.shards()) {
      for (const Chunk& c : s.chunks) maxChunk = std::max(maxChunk, c.elemCount);
    }
    const auto n = static_cast<size_t>(ctx.size());
    servers = ctx.peers().networkServers().size();
    slot = (narrowWireBytes(maxChunk, wire) + 63) & ~size_t{63};
    const size_t ownChunks = cp.mine ? cp.mine->chunks.size() : 0;
    ringAt = (2 * servers * kNarrowWindow + ownChunks) * slot;
    const size_t floatsAt = ringAt + (cp.mine ? ShardRing::scratchBytes(ctx.size(), depth, slot) : 0);
    base = ctx.memory().scratch(floatsAt + (n + 1) * maxChunk * sizeof(float));
    wide = reinterpret_cast<float*>(base + floatsAt);
  }
  uint8_t* out(const Shard& s, size_t k) const {
    return base + (s.server * kNarrowWindow + k % kNarrowWindow) * slot;
  }
  uint8_t* back(const Shard& s, size_t k) const {
    return base + ((servers + s.server) * kNarrowWindow + k % kNarrowWindow) * slot;
  }
  uint8_t* result(size_t k) const { return base + (2 * servers * kNarrowWindow + k) * slot; }
};

void allreduceCoreNarrow(EngineContext& ctx, uint64_t seq, const CollectiveSignature& sig,
                         float* data, uint64_t planSeq, const ExtraMessages& extra) {
  const int rank = ctx.rank();
  const int n = ctx.size();
  const DataType wire = ctx.config().crossHostDtype;
  const std::vector<int>& servers = ctx.peers().networkServers();
  const size_t wes = elementSize(wire);
  const CallPlan cp(ctx, sig, planSeq, wes);
  const Shard* mine = cp.mine;
  const size_t depth = static_cast<size_t>(ringDepthFor(ctx.config(), ctx.peers().oneHost()));
  const size_t W = kNarrowWindow;
  const NarrowScratch sc(ctx, cp, depth, wire);
  float* wide = sc.wide;
  auto unpack = [&](float* dst, const void* src, uint64_t count, int from, const char* what) {
    if (!unpackNarrowWire(dst, src, count, wire)) {
      throwInvalidWireScale(wire, "the " + std::string(what) + " from rank " +
                                      std::to_string(from));
    }
  };
  Exchange ex(ctx, seq, sig);

  // Server side: widen every contribution (its own through the wire form
  // too), sum in f32, pack once, send and read back those bytes.
  std::optional<ShardRing> server;
  if (mine) {
    server.emplace(ctx, ex, *mine, depth, sc.base + sc.ringAt, sc.slot,
                   [wire](uint64_t count) { return narrowWireBytes(count, wire); },
                   [&](size_t k, std::vector<const void*>& in) {
      const Chunk& c = mine->chunks[k];
      uint8_t* res = sc.result(k);
      const int bad = serveNarrowWire(data + c.elemOffset, res, in.data(), n, rank, c.elemCount,
                                      wire, sig.op, n, wide);
      if (bad >= 0) {
        throwInvalidWireScale(wire, "the contribution from rank " + std::to_string(bad));
      }
      return ShardRing::Result{res, narrowWireBytes(c.elemCount, wire), c.elemOffset * wes};
    });
    server->start();
  }

  // Worker side, as postWorkerSide, through the rings.
  std::function<void(const Shard&, size_t)> armResult = [&](const Shard& s, size_t k) {
    const Chunk& c = s.chunks[k];
    const int server = servers[s.server];
    ex.recv(server, kPhaseFromServer, c.index, sc.back(s, k), narrowWireBytes(c.elemCount, wire),
            [&, sp = &s, k, server] {
              const Chunk& ck = sp->chunks[k];
              unpack(data + ck.elemOffset, sc.back(*sp, k), ck.elemCount, server, "result");
              if (k + W < sp->chunks.size()) armResult(*sp, k + W);
            });
  };
  std::function<void(const Shard&, size_t)> sendChunk = [&](const Shard& s, size_t k) {
    const Chunk& c = s.chunks[k];
    packNarrowWire(sc.out(s, k), data + c.elemOffset, c.elemCount, wire, wide);
    ex.send(servers[s.server], kPhaseToServer, c.index, c.elemOffset * wes, sc.out(s, k),
            narrowWireBytes(c.elemCount, wire), [&, sp = &s, k] {
              if (k + W < sp->chunks.size()) sendChunk(*sp, k + W);
            });
  };
  for (const Shard& s : cp.plan.shards()) {
    if (servers[s.server] == rank) continue;
    for (size_t k = 0; k < std::min(W, s.chunks.size()); ++k) armResult(s, k);
  }
  forEachChunkOut(cp.plan, servers, rank, sendChunk, W);
  if (extra) extra(ex);
  ex.run();
}

}  // namespace

bool narrowsOnNetwork(const EngineContext& ctx, DataType dtype, ReduceOp op) {
  return ctx.config().crossHostDtype != DataType::kFloat32 && dtype == DataType::kFloat32 &&
         (op == ReduceOp::kSum || op == ReduceOp::kAvg) && ctx.size() > 1 &&
         ctx.peers().hostCount() == ctx.size();
}

void allreduceBuffers(EngineContext& ctx, uint64_t seq, const std::vector<Buffer>& bufs,
                      DataType dtype, ReduceOp op, const ExtraMessages& extra) {
  const size_t es = elementSize(dtype);
  uint64_t total = 0;
  for (const auto& b : bufs) total += b.numel;
  CollectiveSignature sig{CollectiveType::kAllreduce, dtype, op, total, -1};
  if (ctx.size() == 1) return;  // one rank: every op is the identity (AVG divides by 1)
  const bool narrow = narrowsOnNetwork(ctx, dtype, op);
  auto core = [&](uint8_t* data) {
    if (narrow) {
      allreduceCoreNarrow(ctx, seq, sig, reinterpret_cast<float*>(data), seq, extra);
    } else {
      allreduceCore(ctx, seq, sig, data, seq, ctx.waits().timeout(), extra);
    }
  };
  if (bufs.size() == 1) {
    core(static_cast<uint8_t*>(bufs[0].data));
    return;
  }
  // Several tensors: fuse them into one buffer, reduce once, scatter back.
  uint8_t* fused = ctx.memory().fusionBuffer(total * es);
  uint64_t off = 0;
  for (const auto& b : bufs) {
    if (b.numel) std::memcpy(fused + off * es, b.data, b.numel * es);
    off += b.numel;
  }
  core(fused);
  off = 0;
  for (const auto& b : bufs) {
    if (b.numel) std::memcpy(b.data, fused + off * es, b.numel * es);
    off += b.numel;
  }
}

void runAllreduce(EngineContext& ctx, uint64_t seq, const std::vector<Buffer>& bufs,
                  DataType dtype, ReduceOp op) {
  if (bufs.size() > 1 && ctx.size() > 1) {
    uint64_t total = 0;
    for (const auto& b : bufs) total += b.numel;
    ctx.batches().buffersFused(total * elementSize(dtype));
  }
  allreduceBuffers(ctx, seq, bufs, dtype, op, nullptr);
}

void checkInWithServer(EngineContext& ctx, uint64_t seq, const CollectiveSignature& sig,
                       uint64_t planSeq, std::chrono::milliseconds timeout) {
  allreduceCore(ctx, seq, sig, nullptr, planSeq, timeout);
}

namespace {

// Allreduce on the network, every call alone: the path when queued calls
// cannot fuse (one rank, or a rank with SMDDP_FUSION_BUFFER_BYTES=0).
class NetworkAllreduce final : public NetworkPath {
 public:
  NetworkAllreduce(EngineContext& ctx, std::string why) : NetworkPath(ctx, std::move(why)) {}
  bool fuses() const override { return false; }
  void run(AllreduceBatch& batch) override {
    const AllreduceCall& call = batch.first();
    runAllreduce(ctx_, call.seq, call.bufs, call.dtype, call.op);
  }
};

}  // namespace

std::unique_ptr<AllreducePath> openNetworkAllreduce(EngineContext& ctx, std::string why) {
  return std::make_unique<NetworkAllreduce>(ctx, std::move(why));
}

std::string NetworkPath::describe() const {
  auto kib = [](uint64_t b) { return std::to_string(b >> 10) + " KiB"; };
  const EngineConfig& config = ctx_.config();
  const AlgorithmsConfig& tunables = algorithmsConfig(config);
  const bool fusing = fuses();
  std::ostringstream o;
  o << "over libfabric only (" << why_ << "): " << ctx_.peers().networkServers().size()
    << " reduction server(s), chunk " << kib(config.chunkBytes) << " (down to "
    << kib(std::min(tunables.minChunkBytes, config.chunkBytes)) << " for short shards), ring depth "
    << ringDepthFor(config, ctx_.peers().oneHost()) << ", "
    << (fusing ? "fusion buffer " + kib(tunables.fusionBytes) : std::string("no fusion"));
  if (narrowsOnNetwork(ctx_, DataType::kFloat32, ReduceOp::kSum)) {
    o << ", f32 sums crossing hosts in " << toString(config.crossHostDtype);
  }
  if (CallPlan::inRounds(ctx_, std::max<uint64_t>(tunables.roundsMinBytes, 1))) {
    o << ", pairwise rounds for calls of " << kib(tunables.roundsMinBytes) << " and up";
  }
  return o.str();
}

}  // namespace smddp
