// Page-locked host buffers for the calls the GPU path stages whole (every
// collective but the chunked ones): reused while the group lives, within a
// budget, and freed once the group and the device are done with them, so
// pinned memory is returned rather than cached for the life of the process.
// Sizes round up to an eighth of a power of two (at most 12.5% over), so a
// 300 MB call pins 288 MiB, not 512, and a repeated large call finds its
// buffer again rather than paying cudaHostAlloc and cudaFreeHost each time.
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <vector>

#include "device/device.h"

namespace smddp {

class HostBufferPool : public std::enable_shared_from_this<HostBufferPool> {
  struct Private {};  // make() only: the pool must be owned by a shared_ptr

 public:
  HostBufferPool(Private, std::shared_ptr<Device> device, size_t cacheBytes)
      : device_(std::move(device)), cacheBytes_(cacheBytes) {}
  // Keeps at most `cacheBytes` of released buffers for reuse (the budget).
  static std::shared_ptr<HostBufferPool> make(std::shared_ptr<Device> device, size_t cacheBytes);

  // A buffer of at least `bytes` (sizeClass), an idle one when one fits
  // with at most a quarter to spare. Its deleter hands it back to the pool,
  // which keeps it if it fits the budget, evicting the longest-idle buffers
  // to make room, and frees it otherwise (or when the pool is gone). The
  // calling thread must be bound to the device when a new buffer has to be
  // allocated.
  std::shared_ptr<void> acquire(size_t bytes);
  // Frees every cached buffer (they are idle: released buffers only).
  void clear();
  size_t cachedBytes() const;
  // `bytes` rounded up to a multiple of max(4 KiB, bit_floor(bytes) / 8).
  static size_t sizeClass(size_t bytes);

 private:
  void giveBack(std::shared_ptr<void> mem, size_t size);

  std::shared_ptr<Device> device_;
  size_t cacheBytes_;
  mutable std::mutex mu_;
  struct Idle {
    size_t size;
    std::shared_ptr<void> mem;
  };
  std::list<Idle> idle_;  // guarded by mu_: longest idle first
  size_t idleBytes_ = 0;  // guarded by mu_
};

}  // namespace smddp
