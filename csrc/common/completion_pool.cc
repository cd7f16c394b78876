#include "common/completion_pool.h"

#include <pthread.h>

#include <chrono>
#include <exception>
#include <new>
#include <thread>

#include "common/logging.h"
#include "common/thread_name.h"

namespace smddp {

namespace {
// A thread beyond the first that found no work for this long exits.
constexpr auto kIdleExit = std::chrono::seconds(5);
}  // namespace

void resetCompletionPoolAfterFork() {
  // Only the forking thread exists in the child. It holds mu_ (taken in
  // the prepare handler), so the queue and counts are consistent; the
  // parent's queued work and its threads stay behind in the parent. The
  // queue's old elements are not destroyed: they refer to the parent's
  // objects.
  CompletionPool& p = CompletionPool::instance();
  new (&p.queue_) std::deque<std::function<void()>>();
  new (&p.cv_) std::condition_variable();
  p.threads_ = 0;
  p.idle_ = 0;
  p.mu_.unlock();
}

CompletionPool& CompletionPool::instance() {
  static CompletionPool* pool = [] {
    auto* p = new CompletionPool();  // never destroyed: threads may outlive static destructors
    pthread_atfork([] { CompletionPool::instance().mu_.lock(); },
                   [] { CompletionPool::instance().mu_.unlock(); },
                   [] { resetCompletionPoolAfterFork(); });
    return p;
  }();
  return *pool;
}

void CompletionPool::post(std::function<void()> fn) {
  bool spawn = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(fn));
    if (static_cast<int>(queue_.size()) > idle_ && threads_ < kMaxThreads) {
      ++threads_;
      spawn = true;
    }
  }
  if (spawn) {
    try {
      std::thread([this] { runThread(); }).detach();
    } catch (const std::exception& e) {
      // No new thread: the work waits for one of the running threads.
      std::lock_guard<std::mutex> lock(mu_);
      --threads_;
      SMDDP_LOG(kWarn) << "completion pool: cannot start a thread (" << e.what() << ")";
    }
  } else {
    cv_.notify_one();
  }
}

size_t CompletionPool::threads() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<size_t>(threads_);
}

void CompletionPool::runThread() {
  nameThisThread("smddp-complete");
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    while (queue_.empty()) {
      ++idle_;
      const bool woken = cv_.wait_for(lock, kIdleExit, [&] { return !queue_.empty(); });
      --idle_;
      if (!woken && threads_ > 1) {
        --threads_;
        return;
      }
    }
    std::function<void()> fn = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    try {
      fn();
    } catch (const std::exception& e) {
      SMDDP_LOG(kError) << "a completion callback threw: " << e.what();
    } catch (...) {
      SMDDP_LOG(kError) << "a completion callback threw";
    }
    fn = nullptr;  // release what it holds outside the lock
    lock.lock();
  }
}

}  // namespace smddp
