// Where the user code attached to a collective's completion runs.
//
// A Work's future runs its callbacks (`future.then(...)`, DDP's comm hooks)
// on the thread that completes it. Such a callback may issue another
// collective and wait for it (PowerSGD's hook does), so it must never run on
// an engine thread: that thread would wait for itself. The pool runs them
// instead, and starts another thread whenever every thread it has is busy
// (a callback blocked in a wait), so a chain of callbacks that wait on each
// other's collectives always has a thread to complete the next one.
// docs/design.md, "Failure model".
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>

namespace smddp {

class CompletionPool {
 public:
  // The process's pool. It lives as long as the process (threads of a
  // process that exits are never joined), and a forked child starts with an
  // empty one.
  static CompletionPool& instance();

  // Runs fn on a pool thread, soon. Exceptions from fn are logged.
  void post(std::function<void()> fn);

  // Threads started and still running (tests).
  size_t threads();

  // At most this many threads; beyond it, work waits for a free thread.
  static constexpr int kMaxThreads = 64;

 private:
  CompletionPool() = default;
  void runThread();
  friend void resetCompletionPoolAfterFork();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  int threads_ = 0;                          // guarded by mu_
  int idle_ = 0;                             // guarded by mu_: threads waiting for work
};

}  // namespace smddp
