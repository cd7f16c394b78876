// FileBootstrap (transport/bootstrap.h), the store of the thread-rank
// tests and of single-host groups without a c10d store. Oracle: the
// value read back is one that some writer wrote, whole.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "transport/bootstrap.h"

using namespace smddp;

TEST_CASE("threads of one process setting one key at once all succeed", "[bootstrap]") {
  // The desync report has every rank that timed out ask every other to post
  // its position, so one key gets concurrent writers; with ranks as threads
  // they share a pid, and a temporary file named by pid alone was renamed
  // away under a second writer ("cannot rename bootstrap file").
  char tmpl[] = "/tmp/smddp-boot-XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  FileBootstrap boot(dir);
  constexpr int kThreads = 4;
  constexpr int kWrites = 400;
  std::atomic<int> failures{0};
  std::string firstError;
  std::mutex mu;
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      const std::string value(1000 + t, static_cast<char>('a' + t));
      for (int i = 0; i < kWrites; ++i) {
        try {
          boot.set("desync/pos/0", value);
        } catch (const std::exception& e) {
          if (failures.fetch_add(1) == 0) {
            std::lock_guard<std::mutex> lock(mu);
            firstError = e.what();
          }
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  INFO(firstError);
  CHECK(failures.load() == 0);
  std::string v;
  REQUIRE(boot.tryGet("desync/pos/0", &v));
  REQUIRE(!v.empty());
  const int writer = v[0] - 'a';
  REQUIRE(writer >= 0);
  REQUIRE(writer < kThreads);
  CHECK(v == std::string(1000 + writer, v[0]));
  CHECK(std::system(("rm -rf " + dir).c_str()) == 0);
}
