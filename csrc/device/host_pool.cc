#include "device/host_pool.h"

#include <bit>

namespace smddp {

std::shared_ptr<HostBufferPool> HostBufferPool::make(std::shared_ptr<Device> device,
                                                     size_t cacheBytes) {
  return std::make_shared<HostBufferPool>(Private{}, std::move(device), cacheBytes);
}

std::shared_ptr<void> HostBufferPool::acquire(size_t bytes) {
  const size_t size = std::bit_ceil(std::max<size_t>(bytes, 4096));
  std::shared_ptr<void> mem;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = idle_.find(size);
    if (it != idle_.end()) {
      mem = std::move(it->second);
      idle_.erase(it);
      idleBytes_ -= size;
    }
  }
  if (!mem) mem = device_->allocHost(size);
  void* p = mem.get();
  std::weak_ptr<HostBufferPool> pool = weak_from_this();
  return std::shared_ptr<void>(p, [pool, mem, size](void*) mutable {
    if (auto owner = pool.lock()) owner->giveBack(std::move(mem), size);
  });
}

void HostBufferPool::giveBack(std::shared_ptr<void> mem, size_t size) {
  std::lock_guard<std::mutex> lk(mu_);
  if (idleBytes_ + size > cacheBytes_) return;  // `mem` is freed as it goes
  idle_.emplace(size, std::move(mem));
  idleBytes_ += size;
}

void HostBufferPool::clear() {
  std::multimap<size_t, std::shared_ptr<void>> idle;
  {
    std::lock_guard<std::mutex> lk(mu_);
    idle.swap(idle_);
    idleBytes_ = 0;
  }
}

size_t HostBufferPool::cachedBytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return idleBytes_;
}

}  // namespace smddp
