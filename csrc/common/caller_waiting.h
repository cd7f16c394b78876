// Whether a caller of this process is blocked waiting on a collective
// (Work::wait, a synchronous call). While one is, that thread is not
// computing, so an engine thread may poll for a bounded time without
// taking a core compute needs; while none is (DDP's backward runs while
// its buckets are reduced), engine threads sleep instead of polling.
#pragma once

#include <atomic>

namespace smddp {

inline std::atomic<int>& callersWaiting() {
  static std::atomic<int> n{0};
  return n;
}

inline bool aCallerIsWaiting() { return callersWaiting().load(std::memory_order_relaxed) > 0; }

// Marks the current thread as waiting for its scope.
class CallerWaiting {
 public:
  CallerWaiting() { callersWaiting().fetch_add(1, std::memory_order_relaxed); }
  ~CallerWaiting() { callersWaiting().fetch_sub(1, std::memory_order_relaxed); }
  CallerWaiting(const CallerWaiting&) = delete;
  CallerWaiting& operator=(const CallerWaiting&) = delete;
};

}  // namespace smddp
