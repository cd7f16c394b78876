// Pairwise rounds on the network-only path (docs/design.md, "Pairwise
// rounds"): the order and clock of a rank's sends, and the worker side of
// a call. algorithms/allreduce.cc's allreduceCore runs them with a
// ShardRing (shard_ring.h).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "engine/exchange.h"
#include "reduce/shard_plan.h"

namespace smddp {

// Pairwise rounds, for large calls between many hosts (docs/design.md,
// "Pairwise rounds"). In round r = 1 .. n-1 rank i sends server i + r its
// shard and takes server i - r's; once its shard is complete it returns the
// result the same way, to i + 1 first. So each link carries one flow each
// way at a time, where the all-to-all pattern (allreduce.cc) sends n - 1 at
// once into every host's link (8 hosts at 2 Gbit/s: plain TCP moved the
// bound's bytes at 93-95% of it in a ring, 82-91% all to all; docs/notes/
// 2026-11-27-congestion-control.md). Servers still combine in rank order:
// the same bytes as the all-to-all pattern.
//
// A rank's sends go out strictly in that order, and a result only once its
// chunk is reduced. A send's completion says little across hosts (a TCP
// socket takes megabytes before anything moved, and a flow let loose that
// way overshoots the link's queue), so what arrives clocks the sends: the
// j-th chunk of data goes once j + 1 - window chunks of data came in, and
// the same for results. Every shard has as many chunks (allreduce.cc's
// CallPlan), so in each round a rank sends as many chunks as it takes: the
// links are alike, and what came in says what went out.
class OrderedSends {
 public:
  enum Clock { kData = 0, kResults = 1 };
  OrderedSends(Exchange& ex, size_t window, size_t ownChunks)
      : ex_(ex), window_(window), reduced_(ownChunks, false) {}
  // The send waits until `clock` counted `need` arrivals and, with
  // `afterChunk` >= 0, for release(afterChunk).
  void add(int peer, uint32_t phase, uint32_t index, uint64_t offset, const void* src,
           size_t bytes, Clock clock, uint64_t need, int64_t afterChunk = -1) {
    items_.push_back({peer, phase, index, offset, src, bytes, clock, need, afterChunk});
  }
  void release(size_t k) {
    reduced_[k] = true;
    pump();
  }
  void arrive(Clock clock) {
    ++arrived_[clock];
    pump();
  }
  size_t window() const { return window_; }
  // The arrivals the j-th send (from 0) of a clock waits for: the first
  // window() go at once, then one per arrival.
  uint64_t need(uint64_t j) const { return j + 1 > window_ ? j + 1 - window_ : 0; }
  void pump() {
    while (next_ < items_.size() && inFlight_ < window_) {
      const Item& it = items_[next_];
      if (arrived_[it.clock] < it.need) return;
      if (it.afterChunk >= 0 && !reduced_[static_cast<size_t>(it.afterChunk)]) return;
      ++next_;
      ++inFlight_;
      ex_.send(it.peer, it.phase, it.index, it.offset, it.src, it.bytes, [this] {
        --inFlight_;
        pump();
      });
    }
  }

 private:
  struct Item {
    int peer;
    uint32_t phase, index;
    uint64_t offset;
    const void* src;
    size_t bytes;
    Clock clock;
    uint64_t need;
    int64_t afterChunk;
  };
  Exchange& ex_;
  const size_t window_;
  std::vector<bool> reduced_;
  uint64_t arrived_[2] = {0, 0};
  std::vector<Item> items_;
  size_t next_ = 0, inFlight_ = 0;
};
// Chunks each rank keeps in flight in pairwise rounds: this many bytes, and
// at least two chunks. At 8 x 1 hosts 512 KiB to 2 MiB were alike and 4 MiB
// lost at 64 MiB calls (docs/notes/2026-11-29-rounds-window.md).
constexpr size_t kRoundsWindowBytes = 1 << 20;
// The window, in chunks of `chunkBytes`.
inline size_t roundsWindow(uint64_t chunkBytes) {
  return std::max<size_t>(2, (kRoundsWindowBytes + chunkBytes - 1) / chunkBytes);
}

// The smallest call that crosses `hosts` hosts in pairwise rounds:
// SMDDP_ROUNDS_MIN_BYTES (at least 1) from SMDDP_ROUNDS_MIN_HOSTS hosts and
// at least three; UINT64_MAX (never) with fewer. Bytes count the
// all-gather's output, the reduce-scatter's input, the allreduce's buffer.
uint64_t roundsFromBytes(const EngineConfig& c, int hosts);
// Whether a call of `bytes` between ranks that each have a host of their
// own runs in pairwise rounds (roundsFromBytes over the ranks).
bool roundsFor(const EngineContext& ctx, uint64_t bytes);

// A call's sends to other hosts, for the direct collectives and the
// hierarchy's crossing: in pairwise rounds, an OrderedSends on the kData
// clock (the caller adds them round by round, and hands every receive
// onArrive()); else each goes at once.
class RoundSends {
 public:
  RoundSends(EngineContext& ctx, Exchange& ex, bool rounds, uint64_t chunkBytes);
  RoundSends(const RoundSends&) = delete;
  RoundSends& operator=(const RoundSends&) = delete;
  bool rounds() const { return ordered_.has_value(); }
  // What a receive runs once its chunk arrived: in rounds, the clock of the
  // sends; else null.
  std::function<void()> onArrive();
  void send(int peer, uint32_t phase, uint32_t index, uint64_t offset, const void* src,
            size_t bytes);

 private:
  Exchange& ex_;
  std::optional<OrderedSends> ordered_;
  uint64_t sent_ = 0;
};

// The worker side in pairwise rounds, and the server's results: receives
// in the order the servers send (server i - 1 first), then the shards to
// servers i + 1, i + 2, ..., then this rank's results to the same peers,
// each once reduced (the server ring releases them, and counts the data
// that comes in on the kData clock).
void postInRounds(Exchange& ex, const ShardPlan& plan, const std::vector<int>& servers, int rank,
                  int n, uint8_t* data, size_t es, OrderedSends& sends);

}  // namespace smddp
