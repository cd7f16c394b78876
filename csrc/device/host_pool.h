// Page-locked host buffers for the calls the GPU path stages whole (every
// collective but the chunked ones): reused while the group lives, up to a
// cap, and freed once the group and the device are done with them, so
// pinned memory is returned rather than cached for the life of the process.
#pragma once

#include <cstddef>
#include <map>
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
  // Keeps at most `cacheBytes` of released buffers for reuse.
  static std::shared_ptr<HostBufferPool> make(std::shared_ptr<Device> device, size_t cacheBytes);

  // A buffer of at least `bytes` (rounded up to a power of two from 4 KiB).
  // Its deleter hands it back to the pool, or frees it when the pool is
  // gone or full. The calling thread must be bound to the device when a
  // new buffer has to be allocated.
  std::shared_ptr<void> acquire(size_t bytes);
  // Frees every cached buffer (they are idle: released buffers only).
  void clear();
  size_t cachedBytes() const;

 private:
  void giveBack(std::shared_ptr<void> mem, size_t size);

  std::shared_ptr<Device> device_;
  size_t cacheBytes_;
  mutable std::mutex mu_;
  std::multimap<size_t, std::shared_ptr<void>> idle_;  // guarded by mu_: by size
  size_t idleBytes_ = 0;                               // guarded by mu_
};

}  // namespace smddp
