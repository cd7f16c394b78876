// Who issued each collective last among the ranks of one host, and the wait
// that alone caused: the live half of straggler attribution (the offline
// half reads SMDDP_TIMELINE files: python -m torch_smddp.trace stragglers).
//
// Each rank stamps, in the host segment, the steady-clock time at which it
// issued each sequence number (a ring of kArrivalRing per rank), then
// publishes its issued counter. The rank that then sees every rank of the
// host past a sequence attributes it once (a claim on the window slot):
// the rank with the latest stamp was last, and the wait it alone caused is
// its stamp minus the one before it. The last kStragglerWindow
// attributions are kept; any rank of the host reads them (stats()).
//
// The clock is CLOCK_MONOTONIC (std::chrono::steady_clock), one clock for
// every process of a host. Across hosts each host ranks its own ranks.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>

#include "engine/allreduce_path.h"  // Stragglers

namespace smddp {

constexpr int kArrivalMaxRanks = 64;
constexpr uint64_t kArrivalRing = 64;        // issue stamps each rank keeps
constexpr uint64_t kStragglerWindow = 256;   // attributions kept: the window
// SMDDP_STRAGGLER_REPORT names a rank only if the waits it caused average
// at least this much a call: on a host with more ranks than cores, some
// rank is last most of the time by a scheduler's tick (a 4-rank job on 2
// cores: 81% of an even window, 6.3 ms in all), which holds nobody back.
constexpr int64_t kStragglerReportMinWaitNs = 100'000;

struct ArrivalStamp {
  std::atomic<uint64_t> seq{0};  // sequence + 1 whose issue time `ns` holds
  std::atomic<int64_t> ns{0};
};

// Written by one rank only.
struct alignas(64) RankArrivals {
  ArrivalStamp ring[kArrivalRing];
};

struct Attribution {
  std::atomic<uint64_t> claimed{0};  // sequence + 1 of the rank that took the slot
  std::atomic<uint64_t> seq{0};      // sequence + 1 once rank and waitNs hold it
  std::atomic<int32_t> rank{-1};     // local index of the last to issue it
  std::atomic<int64_t> waitNs{0};    // its stamp minus the one before it
};

struct ArrivalBoard {
  RankArrivals ranks[kArrivalMaxRanks];
  Attribution window[kStragglerWindow];
};

// Before rank `me` publishes that it issued every sequence below `next`
// (it had published `from`): stamps [from, next) with `nowNs` (at most the
// last kArrivalRing of them).
void stampArrivals(ArrivalBoard& board, int me, uint64_t from, uint64_t next, int64_t nowNs);

// After it published, behind a seq_cst fence: attributes each sequence of
// [from, next) that every one of the `ranks` ranks has issued
// (issuedOf(p) > seq) and nobody attributed yet. Of two ranks that publish
// at once at least one sees the other, so every sequence is attributed
// exactly once. Returns how many window boundaries ((seq + 1) %
// kStragglerWindow == 0) this call attributed.
int attributeArrivals(ArrivalBoard& board, int ranks, uint64_t from, uint64_t next,
                      const std::function<uint64_t(int)>& issuedOf);

// The kept attributions, one row per local rank in local order (rank =
// the local index; the caller maps it to the group's rank).
Stragglers readStragglers(const ArrivalBoard& board, int ranks);

}  // namespace smddp
