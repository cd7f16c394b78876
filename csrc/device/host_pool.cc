#include "device/host_pool.h"

#include <algorithm>
#include <bit>

namespace smddp {

std::shared_ptr<HostBufferPool> HostBufferPool::make(std::shared_ptr<Device> device,
                                                     size_t cacheBytes) {
  return std::make_shared<HostBufferPool>(Private{}, std::move(device), cacheBytes);
}

size_t HostBufferPool::sizeClass(size_t bytes) {
  const size_t b = std::max<size_t>(bytes, 4096);
  const size_t step = std::max<size_t>(4096, std::bit_floor(b) / 8);
  return (b + step - 1) / step * step;
}

std::shared_ptr<void> HostBufferPool::acquire(size_t bytes) {
  const size_t want = sizeClass(bytes);
  std::shared_ptr<void> mem;
  size_t size = want;
  {
    // The smallest idle buffer that fits with at most a quarter to spare:
    // a small call never holds a large buffer another call could reuse.
    std::lock_guard<std::mutex> lk(mu_);
    auto best = idle_.end();
    for (auto it = idle_.begin(); it != idle_.end(); ++it) {
      if (it->size >= want && it->size <= want + want / 4 && (best == idle_.end() || it->size < best->size)) {
        best = it;
      }
    }
    if (best != idle_.end()) {
      size = best->size;
      mem = std::move(best->mem);
      idleBytes_ -= size;
      idle_.erase(best);
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
  std::list<Idle> evicted;  // freed after the lock is let go
  std::lock_guard<std::mutex> lk(mu_);
  if (size > cacheBytes_) return;  // `mem` is freed as it goes
  // The buffer just released is the likeliest to be asked for again (the
  // same call next step): the longest-idle ones make room for it.
  while (idleBytes_ + size > cacheBytes_) {
    idleBytes_ -= idle_.front().size;
    evicted.splice(evicted.end(), idle_, idle_.begin());
  }
  idle_.push_back({size, std::move(mem)});
  idleBytes_ += size;
}

void HostBufferPool::clear() {
  std::list<Idle> idle;
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
