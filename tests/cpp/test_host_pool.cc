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
