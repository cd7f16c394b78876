// What bounds every wait of a group (EngineContext::waits()): the group
// timeout and the stop that shutdown requests. Atomics: any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace smddp {

class WaitLimits {
 public:
  explicit WaitLimits(std::chrono::milliseconds timeout) : timeoutMs_(timeout.count()) {}
  WaitLimits(const WaitLimits&) = delete;
  WaitLimits& operator=(const WaitLimits&) = delete;

  // The group timeout. Any thread may change it (c10d's setTimeout) while
  // the worker reads it, hence the atomic; a call already waiting keeps the
  // deadline it started with.
  std::chrono::milliseconds timeout() const {
    return std::chrono::milliseconds(timeoutMs_.load(std::memory_order_relaxed));
  }
  void setTimeout(std::chrono::milliseconds t) {
    timeoutMs_.store(t.count(), std::memory_order_relaxed);
  }
  // Set once shutdown starts: long waits give up.
  bool stopRequested() const { return stopRequested_.load(); }
  void requestStop() { stopRequested_ = true; }

 private:
  std::atomic<int64_t> timeoutMs_;
  std::atomic<bool> stopRequested_{false};
};

}  // namespace smddp
