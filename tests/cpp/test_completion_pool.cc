// The completion pool runs user callbacks that may block on each other
// (PowerSGD's hook waits, inside one future's callback, for the next
// collective's future): a chain of N callbacks where each waits for the
// one posted after it must finish, which one thread, or any fixed number
// below N, cannot do.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <vector>

#include "common/completion_pool.h"

using smddp::CompletionPool;

namespace {

// Posts link k, which posts link k+1 and waits for it.
void chain(int k, int n, std::vector<std::promise<void>>& done) {
  if (k + 1 < n) {
    CompletionPool::instance().post([k, n, &done] { chain(k + 1, n, done); });
    auto f = done[k + 1].get_future();
    if (f.wait_for(std::chrono::seconds(20)) != std::future_status::ready) return;  // k never set
  }
  done[k].set_value();
}

}  // namespace

TEST_CASE("a chain of callbacks that wait on each other completes", "[completion_pool]") {
  constexpr int kLinks = 12;
  std::vector<std::promise<void>> done(kLinks);
  auto first = done[0].get_future();
  CompletionPool::instance().post([&] { chain(0, kLinks, done); });
  REQUIRE(first.wait_for(std::chrono::seconds(30)) == std::future_status::ready);
  CHECK(CompletionPool::instance().threads() >= static_cast<size_t>(kLinks));
}

TEST_CASE("callbacks run in a forked child", "[completion_pool]") {
  // The parent's threads exist; the child must start its own.
  std::promise<void> warm;
  CompletionPool::instance().post([&] { warm.set_value(); });
  warm.get_future().wait();
  pid_t pid = fork();
  if (pid == 0) {
    std::promise<void> ran;
    auto f = ran.get_future();
    CompletionPool::instance().post([&] { ran.set_value(); });
    _exit(f.wait_for(std::chrono::seconds(10)) == std::future_status::ready ? 0 : 1);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
