// The shared pool behind allocate_tensor (hostpath/shared_pool.h): its
// allocator against a model of free bytes, and a mapping of a pool made
// through /proc/<pid>/fd reading what the owner wrote at the same offset.
#include <catch2/catch.hpp>

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <random>
#include <vector>

#include "common/error.h"
#include "hostpath/shared_pool.h"

using namespace smddp;

TEST_CASE("shared pool ranges: first fit, merge on release, exhaustion", "[shared_pool]") {
  SharedPool::Ranges r(100);
  const uint64_t a = r.take(30), b = r.take(30), c = r.take(40);
  CHECK(a == 0);
  CHECK(b == 30);
  CHECK(c == 60);
  CHECK(r.take(1) == UINT64_MAX);  // full
  r.give(b);
  CHECK(r.take(31) == UINT64_MAX);  // the hole is 30
  r.give(a);                        // merges with b's range: 60 free at 0
  CHECK(r.freeRanges() == 1);
  CHECK(r.take(60) == 0);
  r.give(0);
  r.give(c);  // everything free again, one range
  CHECK(r.freeRanges() == 1);
  CHECK(r.inUse() == 0);
  CHECK(r.take(100) == 0);
  CHECK_THROWS_AS(r.give(5), Error);  // never handed out
}

TEST_CASE("shared pool ranges: random traffic keeps the bytes and never overlaps",
          "[shared_pool]") {
  constexpr uint64_t kBytes = 1 << 16;
  SharedPool::Ranges r(kBytes);
  std::mt19937 rng(7);
  std::map<uint64_t, uint64_t> held;  // offset -> bytes, the oracle
  for (int i = 0; i < 4000; ++i) {
    if (!held.empty() && rng() % 2) {
      auto it = held.begin();
      std::advance(it, rng() % held.size());
      r.give(it->first);
      held.erase(it);
    } else {
      const uint64_t want = 1 + rng() % 4000;
      const uint64_t at = r.take(want);
      if (at == UINT64_MAX) continue;
      REQUIRE(at + want <= kBytes);
      auto next = held.lower_bound(at);
      if (next != held.end()) REQUIRE(at + want <= next->first);
      if (next != held.begin()) REQUIRE(std::prev(next)->first + std::prev(next)->second <= at);
      held[at] = want;
    }
    uint64_t sum = 0;
    for (const auto& [at, bytes] : held) sum += bytes;
    REQUIRE(r.inUse() == sum);
  }
  for (const auto& [at, bytes] : held) r.give(at);
  CHECK(r.freeRanges() == 1);
  CHECK(r.take(kBytes) == 0);
}

TEST_CASE("shared pool: a peer's mapping reads what the owner wrote", "[shared_pool]") {
  SharedPool& pool = SharedPool::process();
  REQUIRE(pool.failure().empty());
  const PoolWhere where = SharedPool::where();
  REQUIRE(where.base != 0);
  const uint64_t before = pool.inUse();
  auto* p = static_cast<uint8_t*>(pool.allocate(10000));
  REQUIRE(p != nullptr);
  CHECK(reinterpret_cast<uint64_t>(p) % 4096 == 0);
  CHECK(pool.inUse() == before + 12288);  // whole pages
  CHECK(where.contains(reinterpret_cast<uint64_t>(p), 10000));
  std::vector<uint8_t> mine(10000);
  for (size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<uint8_t>(i * 7 + 3);
  std::memcpy(p, mine.data(), mine.size());

  // A child process maps this one's pool, as a peer rank does, and checks
  // the bytes it finds at the same address.
  const pid_t owner = getpid();
  const pid_t child = fork();
  if (child == 0) {
    // No mapping of the parent's pool came with the fork (MADV_DONTFORK);
    // checked first, since the mapping below may take the freed addresses.
    const bool unmapped = msync(p, 4096, MS_ASYNC) != 0 && errno == ENOMEM;
    PeerPools peers({owner});
    const uint8_t* at = peers.find(0, where, reinterpret_cast<uint64_t>(p), mine.size());
    const bool same = at && std::memcmp(at, mine.data(), mine.size()) == 0;
    // Outside the pool: not found.
    const bool outside = peers.find(0, where, where.base + where.bytes, 1) == nullptr;
    // The parent's pool is not the child's: nothing to allocate, nothing
    // posted.
    const bool notOurs = SharedPool::process().allocate(64) == nullptr && SharedPool::where().base == 0;
    _exit((same ? 0 : 1) | (outside ? 0 : 2) | (notOurs ? 0 : 4) | (unmapped ? 0 : 8));
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  pool.release(p);
  CHECK(pool.inUse() == before);
}

TEST_CASE("shared pool: a pool that cannot be mapped is not tried again", "[shared_pool]") {
  PeerPools peers({getpid()});
  const PoolWhere bogus{uint64_t{1} << 40, 1 << 20, 9999};  // no such fd
  CHECK(peers.find(0, bogus, bogus.base, 16) == nullptr);
  CHECK(peers.find(0, bogus, bogus.base, 16) == nullptr);
  const PoolWhere none{};
  CHECK_FALSE(none.contains(0, 0));
}

TEST_CASE("shared pool: a staging range grows on demand, is reused, and goes back", "[shared_pool]") {
  SharedPool& pool = SharedPool::process();
  REQUIRE(pool.failure().empty());
  const PoolWhere where = SharedPool::where();
  const uint64_t before = pool.inUse();
  {
    PoolScratch scratch;
    uint8_t* a = scratch.get(5000);
    REQUIRE(a != nullptr);
    CHECK(where.contains(reinterpret_cast<uint64_t>(a), 5000));
    CHECK(pool.inUse() == before + 8192);  // whole pages
    CHECK(scratch.get(100) == a);          // smaller: the same range
    CHECK(scratch.get(5000) == a);
    uint8_t* b = scratch.get(3 << 20);     // larger: a new range, the old one released
    REQUIRE(b != nullptr);
    CHECK(where.contains(reinterpret_cast<uint64_t>(b), 3 << 20));
    CHECK(pool.inUse() == before + (3 << 20));
    std::memset(b, 0x5a, 3 << 20);
    // More than the pool holds: null, and the range it held is gone too.
    CHECK(scratch.get(where.bytes + 4096) == nullptr);
    CHECK(pool.inUse() == before);
    CHECK(scratch.get(4096) != nullptr);
  }
  CHECK(pool.inUse() == before);  // released with the scratch
}
