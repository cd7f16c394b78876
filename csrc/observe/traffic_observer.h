// What stats() counts of a group's traffic: the payload bytes its frames
// carried, sealed and opened (SMDDP_WIRE_ENCRYPT), the frames it refused,
// the sends a failed call abandoned, and the calls that took the
// pairwise-rounds schedule. The engine's wire code and the algorithms
// report here; no counter of these is changed elsewhere. The call observer
// (call_observer.h) counts calls and their latency, the batch observer
// (batch_observer.h) fusion batches and their data steps. The engine
// context holds one per group.
//
// Each hook is one relaxed atomic add: stats() reads a snapshot, never a
// consistent cut.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <type_traits>

#include "observe/stats.h"

namespace smddp {

class TrafficObserver {
 public:
  // `stats` outlives the observer.
  explicit TrafficObserver(StatsCounters& stats) : stats_(stats) {}
  TrafficObserver(const TrafficObserver&) = delete;
  TrafficObserver& operator=(const TrafficObserver&) = delete;

  // A frame's payload went out, or came in and was taken.
  void sent(uint64_t bytes) const { add(stats_.bytesSent, bytes); }
  void received(uint64_t bytes) const { add(stats_.bytesReceived, bytes); }
  // A payload sealed for, or opened from, a peer (transport/peer_seal.h).
  void sealed(uint64_t bytes) const { add(stats_.bytesSealed, bytes); }
  void opened(uint64_t bytes) const { add(stats_.bytesOpened, bytes); }
  // Frames refused: malformed, forged, stale, or past a bounded table.
  void refused(uint64_t frames = 1) const { add(stats_.framesRejected, frames); }

  // A send that a failed call left in the provider; `held`: its memory is
  // kept until the provider lets it go (call_memory.h, p2p_state.h).
  void sendAbandoned(bool held) const {
    add(stats_.abandonedSends, 1);
    if (held) sendHeld();
  }
  // Memory of an abandoned send kept past its call.
  void sendHeld() const { add(stats_.abandonedSendsHeld, 1); }
  // Abandoned sends the provider has since reported done.
  void abandonedSendsDone(uint64_t n) const { add(stats_.abandonedSendsConfirmed, n); }

  // Bytes a rank read from a host peer's shared pool with memcpy
  // (hostpath/shared_pool.h) instead of process_vm_readv.
  void pooledRead(uint64_t bytes) const { add(stats_.poolReadBytes, bytes); }
  // A one-host all-gather step that left before its peers read its staged
  // part (SMDDP_EAGER_GATHER_BYTES).
  void earlyGather() const { add(stats_.earlyGathers, 1); }
  // A call that took the pairwise-rounds schedule (algorithms/allreduce.cc).
  void pairwiseRounds() const { add(stats_.roundsCalls, 1); }

  // Runs `reduce` and adds its wall time to stats()' server_reduce_seconds;
  // returns what it returns. The one place a server's reduction is timed,
  // whichever path serves it: the network-only path's servers
  // (algorithms/shard_ring.h), the host segment's reduce step
  // (hostpath/fusion_steps.cc) and the host servers across hosts
  // (hostpath/cross_host.h). A reduction that throws adds nothing.
  template <typename Reduce>
  auto serverReduce(Reduce&& reduce) const {
    const auto t0 = std::chrono::steady_clock::now();
    const auto done = [this, t0] {
      add(stats_.serverReduceNs,
          static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                    std::chrono::steady_clock::now() - t0)
                                    .count()));
    };
    if constexpr (std::is_void_v<std::invoke_result_t<Reduce&>>) {
      reduce();
      done();
    } else {
      auto result = reduce();
      done();
      return result;
    }
  }

 private:
  static void add(std::atomic<uint64_t>& c, uint64_t n) {
    c.fetch_add(n, std::memory_order_relaxed);
  }
  StatsCounters& stats_;  // atomics
};

}  // namespace smddp
