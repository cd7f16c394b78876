// Pairwise rounds: the worker side of a call (rounds.h).

#include "algorithms/rounds.h"

namespace smddp {

void postInRounds(Exchange& ex, const ShardPlan& plan, const std::vector<int>& servers, int rank,
                  int n, uint8_t* data, size_t es, OrderedSends& sends) {
  std::vector<const Shard*> shardOf(n, nullptr);  // by server rank
  for (const Shard& s : plan.shards()) shardOf[servers[s.server]] = &s;
  const std::vector<Chunk>& mine = shardOf[rank]->chunks;
  const uint64_t W = sends.window();
  auto need = [W](uint64_t j) { return j + 1 > W ? j + 1 - W : 0; };
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
                c.elemCount * es, OrderedSends::kData, need(j++));
    }
  }
  j = 0;
  for (int r = 1; r < n; ++r) {
    for (size_t k = 0; k < mine.size(); ++k) {
      const Chunk& c = mine[k];
      sends.add((rank + r) % n, kPhaseFromServer, c.index, c.elemOffset * es,
                data + c.elemOffset * es, c.elemCount * es, OrderedSends::kResults, need(j++),
                static_cast<int64_t>(k));
    }
  }
}

}  // namespace smddp
