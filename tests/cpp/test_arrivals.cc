// Straggler attribution on one host (hostpath/arrivals.h). Oracle: the
// closed form from the stamps each rank wrote (the last is the latest
// stamp, its wait that stamp minus the one before), and for ranks on
// threads, that each sequence is attributed exactly once.
#include <catch2/catch.hpp>

#include <atomic>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "hostpath/arrivals.h"

using namespace smddp;

namespace {

struct Host {
  explicit Host(int n) : ranks(n), issued(n) {
    for (auto& i : issued) i.store(0);
  }
  int ranks;
  std::unique_ptr<ArrivalBoard> board = std::make_unique<ArrivalBoard>();
  std::vector<std::atomic<uint64_t>> issued;
  std::vector<uint64_t> mark = std::vector<uint64_t>(static_cast<size_t>(ranks), 0);

  // What FusionBufferScheduler::noteIssued does, with the time given.
  int issue(int me, uint64_t next, int64_t ns) {
    const uint64_t from = mark[me];
    mark[me] = next;
    stampArrivals(*board, me, from, next, ns);
    issued[me].store(next);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return attributeArrivals(*board, ranks, from, next,
                             [&](int p) { return issued[p].load(); });
  }
};

}  // namespace

TEST_CASE("the rank with the latest stamp is last, and its wait is the gap to the one before",
          "[arrivals]") {
  Host h(4);
  // Sequence 0: rank 2 issues at 100 ms, the others at 10, 20 and 30 ms.
  // Sequence 1: rank 2 first at 101 ms, rank 0 last at 155 ms, rank 3
  // before it at 150 ms.
  const int64_t ms = 1000000;
  const int64_t t0[4] = {10 * ms, 20 * ms, 100 * ms, 30 * ms};
  const int64_t t1[4] = {155 * ms, 141 * ms, 101 * ms, 150 * ms};
  for (int p : {0, 1, 3, 2}) h.issue(p, 1, t0[p]);
  for (int p : {2, 1, 3, 0}) h.issue(p, 2, t1[p]);
  Stragglers s = readStragglers(*h.board, 4);
  REQUIRE(s.calls == 2);
  REQUIRE(s.window == kStragglerWindow);
  REQUIRE(s.rows.size() == 4);
  CHECK(s.rows[2].last == 1);
  CHECK(s.rows[2].causedNs == 70 * ms);
  CHECK(s.rows[0].last == 1);
  CHECK(s.rows[0].causedNs == 5 * ms);
  CHECK(s.rows[1].last == 0);
  CHECK(s.rows[3].last == 0);
}

TEST_CASE("a sequence nobody has finished issuing is not attributed", "[arrivals]") {
  Host h(3);
  h.issue(0, 1, 5);
  h.issue(1, 1, 6);
  CHECK(readStragglers(*h.board, 3).calls == 0);
  h.issue(2, 1, 9);
  Stragglers s = readStragglers(*h.board, 3);
  CHECK(s.calls == 1);
  CHECK(s.rows[2].last == 1);
  CHECK(s.rows[2].causedNs == 3);
}

TEST_CASE("only the last window of attributions counts, and a window boundary is reported once",
          "[arrivals]") {
  Host h(2);
  int boundaries = 0;
  const uint64_t calls = kStragglerWindow + 40;
  for (uint64_t s = 0; s < calls; ++s) {
    // Rank 1 is last in the first 100 calls by 7 ns, rank 0 after that by 3 ns.
    const bool early = s < 100;
    const int64_t base = static_cast<int64_t>(s) * 1000;
    boundaries += h.issue(0, s + 1, base + (early ? 0 : 3));
    boundaries += h.issue(1, s + 1, base + (early ? 7 : 0));
  }
  CHECK(boundaries == 1);
  Stragglers st = readStragglers(*h.board, 2);
  REQUIRE(st.calls == kStragglerWindow);
  // The window is calls 40 .. 295: rank 1 last in 40 .. 99.
  CHECK(st.rows[1].last == 60);
  CHECK(st.rows[1].causedNs == 60 * 7);
  CHECK(st.rows[0].last == kStragglerWindow - 60);
  CHECK(st.rows[0].causedNs == static_cast<int64_t>(kStragglerWindow - 60) * 3);
}

TEST_CASE("several sequences issued at once are each attributed", "[arrivals]") {
  Host h(2);
  h.issue(0, 5, 100);  // sequences 0 .. 4 at once (a fence released them)
  h.issue(1, 5, 180);
  Stragglers s = readStragglers(*h.board, 2);
  CHECK(s.calls == 5);
  CHECK(s.rows[1].last == 5);
  CHECK(s.rows[1].causedNs == 5 * 80);
}

TEST_CASE("ranks issuing on threads attribute every sequence exactly once", "[arrivals]") {
  const int ranks = 4;
  const uint64_t calls = kStragglerWindow;  // all of them stay in the window
  Host h(ranks);
  std::atomic<uint64_t> gate{0};
  std::vector<std::thread> threads;
  for (int p = 0; p < ranks; ++p) {
    threads.emplace_back([&, p] {
      std::mt19937 rng(static_cast<unsigned>(p));
      for (uint64_t s = 0; s < calls; ++s) {
        // Nobody runs more than one call ahead of the slowest (a blocking
        // allreduce), so every stamp is still in the ring when read.
        while (gate.load() < s) std::this_thread::yield();
        for (int spin = static_cast<int>(rng() % 200); spin > 0; --spin) {
          std::atomic_signal_fence(std::memory_order_seq_cst);
        }
        h.issue(p, s + 1, static_cast<int64_t>(s) * 100000 + static_cast<int64_t>(rng() % 1000));
        bool all = true;
        for (int q = 0; q < ranks; ++q) all = all && h.issued[q].load() >= s + 1;
        if (all) {
          uint64_t g = s;
          gate.compare_exchange_strong(g, s + 1);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  Stragglers st = readStragglers(*h.board, ranks);
  CHECK(st.calls == calls);
  uint64_t total = 0;
  for (const auto& r : st.rows) total += r.last;
  CHECK(total == calls);
  // Closed form per sequence: the latest stamp of each, from the rings.
  for (uint64_t s = calls - kArrivalRing; s < calls; ++s) {
    int64_t latest = -1;
    int who = -1;
    for (int p = 0; p < ranks; ++p) {
      const int64_t ns = h.board->ranks[p].ring[s % kArrivalRing].ns.load();
      if (ns >= latest) {
        latest = ns;
        who = p;
      }
    }
    const Attribution& a = h.board->window[s % kStragglerWindow];
    CHECK(a.seq.load() == s + 1);
    CHECK(a.rank.load() == who);
  }
}
