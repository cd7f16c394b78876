// Pairwise rounds: the worker side of a call (rounds.h).

#include "algorithms/rounds.h"

#include <algorithm>

#include "algorithms/algorithms_config.h"
#include "engine/engine_context.h"

namespace smddp {

uint64_t roundsFromBytes(const EngineConfig& c, int hosts) {
  const AlgorithmsConfig& a = algorithmsConfig(c);
  const bool many = a.roundsMinHosts > 0 && hosts >= 3 && hosts >= a.roundsMinHosts;
  return many ? std::max<uint64_t>(a.roundsMinBytes, 1) : UINT64_MAX;
}

bool roundsFor(const EngineContext& ctx, uint64_t bytes) {
  return ctx.peers().hostCount() == ctx.size() && bytes >= roundsFromBytes(ctx.config(), ctx.size());
}

RoundSends::RoundSends(EngineContext& ctx, Exchange& ex, bool rounds, uint64_t chunkBytes)
    : ex_(ex) {
  if (!rounds) return;
  ctx.traffic().pairwiseRounds();
  ordered_.emplace(ex, roundsWindow(chunkBytes), 0);
}

std::function<void()> RoundSends::onArrive() {
  if (!ordered_) return nullptr;
  return [this] { ordered_->arrive(OrderedSends::kData); };
}

void RoundSends::send(int peer, uint32_t phase, uint32_t index, uint64_t offset, const void* src,
                      size_t bytes) {
  if (!ordered_) {
    ex_.send(peer, phase, index, offset, src, bytes);
    return;
  }
  ordered_->add(peer, phase, index, offset, src, bytes, OrderedSends::kData,
                ordered_->need(sent_++));
  ordered_->pump();
}

void postInRounds(Exchange& ex, const ShardPlan& plan, const std::vector<int>& servers, int rank,
                  int n, uint8_t* data, size_t es, OrderedSends& sends) {
  std::vector<const Shard*> shardOf(n, nullptr);  // by server rank
  for (const Shard& s : plan.shards()) shardOf[servers[s.server]] = &s;
  const std::vector<Chunk>& mine = shardOf[rank]->chunks;
  for (int r = 1; r < n; ++r) {
    const int server = (rank - r + n) % n;
    for (const Chunk& c : shardOf[server]->chunks) {
      ex.recv(server, kPhaseFromServer, c.index, data + c.elemOffset * es, c.elemCount * es,
              [&sends] { sends.arrive(OrderedSends::kResults); });
    }
  }
  uint64_t j = 0;
  for (int r = 1; r < n; ++r) {
    const int server = (rank + r) % n;
    for (const Chunk& c : shardOf[server]->chunks) {
      sends.add(server, kPhaseToServer, c.index, c.elemOffset * es, data + c.elemOffset * es,
                c.elemCount * es, OrderedSends::kData, sends.need(j++));
    }
  }
  j = 0;
  for (int r = 1; r < n; ++r) {
    for (size_t k = 0; k < mine.size(); ++k) {
      const Chunk& c = mine[k];
      sends.add((rank + r) % n, kPhaseFromServer, c.index, c.elemOffset * es,
                data + c.elemOffset * es, c.elemCount * es, OrderedSends::kResults, sends.need(j++),
                static_cast<int64_t>(k));
    }
  }
}

}  // namespace smddp
