// Counters the engine keeps for torch_smddp.stats(). Writers are the worker
// thread; readers take a snapshot from any thread, hence the atomics.
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

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
  uint64_t directCalls = 0;   // allreduces entered through torch_smddp.all_reduce_
  uint64_t standaloneServerBytes = 0;  // bytes pushed to standalone reduction servers
  uint64_t standaloneServerSteps = 0;  // cross-host steps that used them
  uint64_t poolReadBytes = 0;  // read from host peers' shared pools (hostpath/shared_pool.h)
  uint64_t roundsCalls = 0;  // calls whose crossing ran in pairwise rounds (SMDDP_ROUNDS_MIN_HOSTS)
  uint64_t earlyGathers = 0;  // one-host all-gather steps that left before their peers read them
  // Payload bytes encrypted to and decrypted from peers on other hosts
  // (SMDDP_WIRE_ENCRYPT; engine/sealed_frames.h).
  uint64_t bytesSealed = 0;
  uint64_t bytesOpened = 0;
};

// Per-collective latency, queued to completed, per size class: a fixed
// histogram of log-spaced bins for every (collective, size class), so
// recording one call is two relaxed atomic adds and no allocation.
// Size class k holds calls of [4^k, 4^(k+1)) bytes (class 0 also holds 0
// bytes); latency bin 0 holds < 1 us, bin b >= 1 holds
// [2^((b-1)/2), 2^(b/2)) us: two bins per octave, so a percentile read
// from the bins is within a factor sqrt(2) of the true one.
class LatencyHistograms {
 public:
  static constexpr int kCollectives = 16;  // indexed by CollectiveType's value
  static constexpr int kSizeClasses = 16;  // up to 4^16 B = 4 GiB, the last class open
  static constexpr int kBins = 64;         // up to 2^31.5 us (about 50 minutes)

  LatencyHistograms()
      : bins_(new std::atomic<uint64_t>[kCollectives * kSizeClasses * kBins]()),
        sumNs_(new std::atomic<uint64_t>[kCollectives * kSizeClasses]()) {}

  static int sizeClass(uint64_t bytes) {
    if (bytes < 4) return 0;
    const int log2 = 63 - __builtin_clzll(bytes);
    return log2 / 2 < kSizeClasses ? log2 / 2 : kSizeClasses - 1;
  }
  static int bin(uint64_t ns) {
    const uint64_t us = ns / 1000;
    if (us == 0) return 0;
    const int k = 63 - __builtin_clzll(us);  // 2^k <= us < 2^(k+1)
    // The upper half of the octave starts at 2^k * sqrt(2) us, i.e. where
    // ns^2 >= 2^(2k+1) * 10^6 (exact, in 128 bits).
    using u128 = unsigned __int128;
    const bool upper = k >= 40 || u128(ns) * ns >= (u128(1) << (2 * k + 1)) * 1000000u;
    const int b = 1 + 2 * k + (upper ? 1 : 0);
    return b < kBins ? b : kBins - 1;
  }
  // Bounds of bin b in microseconds.
  static double binLowUs(int b) { return b == 0 ? 0.0 : std::exp2((b - 1) / 2.0); }
  static double binHighUs(int b) { return std::exp2(b / 2.0); }
  // What a percentile falling in bin b reports: the bin's geometric middle.
  static double binValueUs(int b) { return b == 0 ? 0.5 : std::exp2((b - 0.5) / 2.0); }

  void record(int collective, uint64_t bytes, uint64_t ns) {
    if (collective < 0 || collective >= kCollectives) return;
    const int cell = collective * kSizeClasses + sizeClass(bytes);
    bins_[cell * kBins + bin(ns)].fetch_add(1, std::memory_order_relaxed);
    sumNs_[cell].fetch_add(ns, std::memory_order_relaxed);
  }
  void reset() {
    for (int i = 0; i < kCollectives * kSizeClasses * kBins; ++i) bins_[i].store(0);
    for (int i = 0; i < kCollectives * kSizeClasses; ++i) sumNs_[i].store(0);
  }

  struct Cell {
    int collective;
    int sizeClass;
    uint64_t count;
    double meanUs;
    double p50Us;
    double p99Us;
  };
  // The cells that saw a call, with their percentiles (from the bins).
  std::vector<Cell> cells() const {
    std::vector<Cell> out;
    std::vector<uint64_t> counts(kBins);
    for (int c = 0; c < kCollectives; ++c) {
      for (int s = 0; s < kSizeClasses; ++s) {
        const int cell = c * kSizeClasses + s;
        uint64_t total = 0;
        for (int b = 0; b < kBins; ++b) {
          counts[b] = bins_[cell * kBins + b].load(std::memory_order_relaxed);
          total += counts[b];
        }
        if (total == 0) continue;
        auto pct = [&](double q) {
          // The smallest bin whose cumulative count reaches q of the calls.
          const double need = q * static_cast<double>(total);
          uint64_t acc = 0;
          for (int b = 0; b < kBins; ++b) {
            acc += counts[b];
            if (static_cast<double>(acc) >= need && acc > 0) return binValueUs(b);
          }
          return binValueUs(kBins - 1);
        };
        out.push_back({c, s, total,
                       sumNs_[cell].load(std::memory_order_relaxed) / 1000.0 / total, pct(0.5),
                       pct(0.99)});
      }
    }
    return out;
  }

 private:
  std::unique_ptr<std::atomic<uint64_t>[]> bins_;
  std::unique_ptr<std::atomic<uint64_t>[]> sumNs_;
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
  std::atomic<uint64_t> directCalls{0};
  std::atomic<uint64_t> standaloneServerBytes{0};
  std::atomic<uint64_t> standaloneServerSteps{0};
  std::atomic<uint64_t> roundsCalls{0};
  std::atomic<uint64_t> poolReadBytes{0};
  std::atomic<uint64_t> earlyGathers{0};
  std::atomic<uint64_t> bytesSealed{0};
  std::atomic<uint64_t> bytesOpened{0};
  // Queued-to-completed latency of every collective (runTasks).
  LatencyHistograms latency;

  // torch_smddp.reset_stats(): every counter and histogram back to zero.
  void reset() {
    for (auto* c : {&bytesSent, &bytesReceived, &collectives, &fusionFlushes, &fusionBytes,
                    &fusedCalls, &chunksInFlightMax, &serverReduceNs, &framesRejected, &errors,
                    &abandonedSends, &abandonedSendsConfirmed, &abandonedSendsHeld, &callerRuns,
                    &smallBatches, &directCalls, &standaloneServerBytes, &standaloneServerSteps,
                    &roundsCalls, &poolReadBytes, &earlyGathers, &bytesSealed, &bytesOpened}) {
      c->store(0);
    }
    latency.reset();
  }

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
    s.directCalls = directCalls.load();
    s.standaloneServerBytes = standaloneServerBytes.load();
    s.standaloneServerSteps = standaloneServerSteps.load();
    s.roundsCalls = roundsCalls.load();
    s.poolReadBytes = poolReadBytes.load();
    s.earlyGathers = earlyGathers.load();
    s.bytesSealed = bytesSealed.load();
    s.bytesOpened = bytesOpened.load();
    return s;
  }
};

}  // namespace smddp
