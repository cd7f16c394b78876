// Counters the engine keeps for torch_smddp.stats(). Writers are the worker
// thread; readers take a snapshot from any thread, hence the atomics.
#pragma once

#include <atomic>
#include <cstdint>

namespace smddp {

struct Stats {
  uint64_t bytesSent = 0;
  uint64_t bytesReceived = 0;
  uint64_t collectives = 0;
  uint64_t fusionFlushes = 0;
  uint64_t fusionBytes = 0;       // total bytes fused (mean fill = fusionBytes/flushes)
  uint64_t fusedCalls = 0;        // allreduce calls that rode in those buffers
  uint64_t chunksInFlightMax = 0;
  uint64_t serverReduceNs = 0;
  uint64_t framesRejected = 0;
  uint64_t errors = 0;
  // Sends still posted when their call failed (or their point-to-point
  // operation was failed): the provider may still read their memory.
  // Each is either confirmed (its completion read within a short wait)
  // or held (its call's memory kept until its completion or shutdown).
  uint64_t abandonedSends = 0;
  uint64_t abandonedSendsConfirmed = 0;
  uint64_t abandonedSendsHeld = 0;
  uint64_t callerRuns = 0;    // calls run on their caller's thread (CallHooks::callerWaits)
  uint64_t smallBatches = 0;  // fusion batches run as small ones (SMDDP_SMALL_BYTES)
};

struct StatsCounters {
  std::atomic<uint64_t> bytesSent{0};
  std::atomic<uint64_t> bytesReceived{0};
  std::atomic<uint64_t> collectives{0};
  std::atomic<uint64_t> fusionFlushes{0};
  std::atomic<uint64_t> fusionBytes{0};
  std::atomic<uint64_t> fusedCalls{0};
  std::atomic<uint64_t> chunksInFlightMax{0};
  std::atomic<uint64_t> serverReduceNs{0};
  std::atomic<uint64_t> framesRejected{0};
  std::atomic<uint64_t> errors{0};
  std::atomic<uint64_t> abandonedSends{0};
  std::atomic<uint64_t> abandonedSendsConfirmed{0};
  std::atomic<uint64_t> abandonedSendsHeld{0};
  std::atomic<uint64_t> callerRuns{0};
  std::atomic<uint64_t> smallBatches{0};

  Stats snapshot() const {
    Stats s;
    s.bytesSent = bytesSent.load();
    s.bytesReceived = bytesReceived.load();
    s.collectives = collectives.load();
    s.fusionFlushes = fusionFlushes.load();
    s.fusionBytes = fusionBytes.load();
    s.fusedCalls = fusedCalls.load();
    s.chunksInFlightMax = chunksInFlightMax.load();
    s.serverReduceNs = serverReduceNs.load();
    s.framesRejected = framesRejected.load();
    s.errors = errors.load();
    s.abandonedSends = abandonedSends.load();
    s.abandonedSendsConfirmed = abandonedSendsConfirmed.load();
    s.abandonedSendsHeld = abandonedSendsHeld.load();
    s.callerRuns = callerRuns.load();
    s.smallBatches = smallBatches.load();
    return s;
  }
};

}  // namespace smddp
