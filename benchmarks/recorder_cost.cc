// What the flight recorder adds to one call, measured directly: the three
// hooks a call runs (queued on the caller's thread, started and ended on the
// thread that runs it), in a loop, on one thread and handed between two
// threads the way the engine does. Compare the figure with the time of the
// cheapest call (a 4 KiB allreduce, benchmarks/RESULTS.md): a group-to-group
// A/B in one process cannot resolve 1% at that size (trace_cost.py).
//   build/smddp_recorder_cost [calls]
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "observe/flight_recorder.h"

using namespace smddp;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  const uint64_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 2000000;
  // The hooks take a time the engine reads anyway; one fixed time here.
  const auto at = Clock::now();
  const CollectiveSignature sig{CollectiveType::kAllreduce, DataType::kFloat32, ReduceOp::kSum,
                                1024, -1};
  {
    FlightRecorder rec("bench", 0, 2, 2000);
    const auto t0 = Clock::now();
    for (uint64_t s = 0; s < n; ++s) {
      rec.queued(s, &sig, at);
      rec.started(s, CallPath::kSharedMemory, s, true, at);
      rec.ended(s, nullptr, 1, at);
    }
    const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / n;
    std::printf("one thread (a call run by its caller): %.1f ns per call\n", ns);
  }
  // The caller queues a call and waits for it; the engine thread starts
  // and ends it (a synchronous call handed to the engine). Timed with and
  // without the recorder: the difference is what it adds, the slot's and
  // the lock's cache lines moving between the threads included.
  auto handoff = [&](bool record) {
    FlightRecorder rec("bench", 0, 2, 2000);
    std::atomic<uint64_t> queued{0}, done{0};
    const auto t0 = Clock::now();
    std::thread engine([&] {
      for (uint64_t s = 0; s < n; ++s) {
        while (queued.load(std::memory_order_acquire) <= s) {
        }
        if (record) {
          rec.started(s, CallPath::kSharedMemory, s, false, at);
          rec.ended(s, nullptr, 1, at);
        }
        done.store(s + 1, std::memory_order_release);
      }
    });
    for (uint64_t s = 0; s < n; ++s) {
      if (record) rec.queued(s, &sig, at);
      queued.store(s + 1, std::memory_order_release);
      while (done.load(std::memory_order_acquire) <= s) {
      }
    }
    engine.join();
    return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / n;
  };
  for (int round = 0; round < 3; ++round) {
    const double off = handoff(false), on = handoff(true);
    std::printf("two threads (caller queues and waits, engine runs): %.1f ns per call with the recorder, "
                "%.1f ns without: %.1f ns added\n", on, off, on - off);
  }
  return 0;
}
