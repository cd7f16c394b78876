// HostBufferPool (device/host_pool.h): page-locked buffers for the GPU
// path's whole-staged calls are reused while the group lives, up to the
// cap, and returned (freed) beyond it and once the pool is gone. The
// oracle is the stand-in's allocation count and the buffers' addresses.
#include <catch2/catch.hpp>

#include <memory>

#include "device/host_pool.h"
#include "device/sim_device.h"

using namespace smddp;

TEST_CASE("the host buffer pool reuses released buffers up to its cap and frees the rest",
          "[staging]") {
  auto dev = makeSimDevice();
  auto pool = HostBufferPool::make(dev, 64 << 10);
  void* first = nullptr;
  {
    auto a = pool->acquire(5000);  // rounded up to 8 KiB
    first = a.get();
  }
  CHECK(pool->cachedBytes() == 8192);
  {
    auto b = pool->acquire(8000);  // the same size class: the same buffer
    CHECK(b.get() == first);
    CHECK(pool->cachedBytes() == 0);
    auto c = pool->acquire(100);  // 4 KiB: a new one
    CHECK(c.get() != first);
  }
  CHECK(pool->cachedBytes() == 8192 + 4096);
  {
    auto big = pool->acquire(1 << 20);  // above the cap once released: freed
  }
  CHECK(pool->cachedBytes() == 8192 + 4096);
  pool->clear();
  CHECK(pool->cachedBytes() == 0);

  // A buffer that outlives its pool is freed, not returned.
  auto late = pool->acquire(4096);
  std::weak_ptr<HostBufferPool> gone = pool;
  pool.reset();
  CHECK(gone.expired());
  late.reset();
  CHECK(sim::violations().empty());
}

TEST_CASE("the host buffer pool rounds to an eighth of a power of two and keeps what fits its budget",
          "[staging]") {
  auto dev = makeSimDevice();
  SECTION("a 300 MB call pins at most an eighth more, and the next one reuses its buffer") {
    auto pool = HostBufferPool::make(dev, size_t{512} << 20);
    const size_t asked = 300'000'000;
    void* first = nullptr;
    {
      auto a = pool->acquire(asked);
      first = a.get();
    }
    CHECK(pool->cachedBytes() >= asked);
    CHECK(pool->cachedBytes() <= asked + asked / 8);  // a power of two would be 512 MiB
    auto again = pool->acquire(asked);
    CHECK(again.get() == first);
    CHECK(pool->cachedBytes() == 0);
  }
  SECTION("a released buffer that fits the budget evicts older idle ones rather than being freed") {
    auto pool = HostBufferPool::make(dev, 96 << 10);
    { auto a = pool->acquire(40 << 10); }
    CHECK(pool->cachedBytes() == (40 << 10));
    void* kept = nullptr;
    {
      auto b = pool->acquire(64 << 10);
      kept = b.get();
    }
    CHECK(pool->cachedBytes() == (64 << 10));  // the 40 KiB one went to make room
    auto c = pool->acquire(64 << 10);
    CHECK(c.get() == kept);
    // A small request never takes a much larger idle buffer.
    c.reset();
    auto small = pool->acquire(4096);
    CHECK(small.get() != kept);
    CHECK(pool->cachedBytes() == (64 << 10));
  }
  SECTION("a buffer larger than the whole budget is freed when released") {
    auto pool = HostBufferPool::make(dev, 64 << 10);
    { auto big = pool->acquire(1 << 20); }
    CHECK(pool->cachedBytes() == 0);
  }
  CHECK(sim::violations().empty());
}
