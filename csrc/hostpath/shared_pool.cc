#include "hostpath/shared_pool.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <iterator>

#include "common/error.h"
#include "common/logging.h"
#include "common/param.h"

namespace smddp {

SMDDP_PARAM_BYTES(paramSharedPoolBytes, "SMDDP_SHARED_POOL_BYTES", 8589934592, 0, 1LL << 46,
                  "Address space of the process's pool behind the backend's allocate_tensor "
                  "(FSDP2's set_allocate_memory_from_process_group_for_comm): peers on the host "
                  "read buffers in it with memcpy instead of process_vm_readv. Reserved, not "
                  "taken: pages are used as tensors touch them. 0: no pool "
                  "(supports_tensor_alloc is false)");

namespace {

constexpr uint64_t kPage = 4096;

std::atomic<SharedPool*> madePool{nullptr};

// Set in a child forked after the pool was made (pthread_atfork), which
// has no mapping of it (MADV_DONTFORK): asked on every post, so a flag
// instead of a getpid() system call each time.
std::atomic<bool> forkedChild{false};

}  // namespace

SharedPool::Ranges::Ranges(uint64_t bytes) {
  if (bytes) free_[0] = bytes;
}

uint64_t SharedPool::Ranges::take(uint64_t bytes) {
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < bytes) continue;
    const uint64_t at = it->first;
    const uint64_t left = it->second - bytes;
    free_.erase(it);
    if (left) free_[at + bytes] = left;
    used_[at] = bytes;
    inUse_ += bytes;
    return at;
  }
  return UINT64_MAX;
}

void SharedPool::Ranges::give(uint64_t offset) {
  auto u = used_.find(offset);
  SMDDP_CHECK(u != used_.end(), kInternal,
              "shared pool: released an address it did not hand out (offset " +
                  std::to_string(offset) + ")");
  uint64_t at = offset, bytes = u->second;
  inUse_ -= bytes;
  used_.erase(u);
  auto next = free_.lower_bound(at);
  if (next != free_.end() && next->first == at + bytes) {
    bytes += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == at) {
      prev->second += bytes;
      return;
    }
  }
  free_[at] = bytes;
}

SharedPool::SharedPool(uint64_t bytes) : ranges_(0) {
  if (bytes == 0) {
    failure_ = "SMDDP_SHARED_POOL_BYTES=0";
    return;
  }
  bytes = (bytes + kPage - 1) / kPage * kPage;
  const int fd = memfd_create("smddp-pool", MFD_CLOEXEC);
  if (fd < 0) {
    failure_ = std::string("memfd_create: ") + std::strerror(errno);
    return;
  }
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    failure_ = std::string("ftruncate: ") + std::strerror(errno);
    close(fd);
    return;
  }
  void* at = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (at == MAP_FAILED) {
    failure_ = std::string("mmap: ") + std::strerror(errno);
    close(fd);
    return;
  }
  // A child forked from this process (a DataLoader worker) gets no
  // mapping of the pool: it would share these pages where private memory
  // is copied on write, and write into its parent's buffers.
  madvise(at, bytes, MADV_DONTFORK);
  // Huge pages where the kernel gives them to shared memory on request
  // (transparent_hugepage/shmem_enabled "advise"; "always" and
  // "within_size" give them anyway, "never" and "deny" ignore this): the
  // peers' copies out of the pool then take 512 times fewer TLB entries.
  // Measured at world 2, pooled buffers, huge pages or not taking turns
  // run by run, 7 pairs: reduce-scatter 1.01-1.78x faster at 64 MiB
  // (0.99-2.21x at 16 MiB, median 1.39x), the out-of-place all-gather
  // 1.02-1.49x at 64 MiB (0.87-1.39x at 16 MiB); the in-place one within
  // the runs' spread over 9 pairs (medians 1.02x and 1.01x at 16 and 64 MiB)
  // (docs/notes/2026-12-08-huge-page-follow-up.md).
  madvise(at, bytes, MADV_HUGEPAGE);
  base_ = static_cast<uint8_t*>(at);
  bytes_ = bytes;
  fd_ = fd;  // kept open: peers open it through /proc/<pid>/fd
  ranges_ = Ranges(bytes);
}

SharedPool& SharedPool::process() {
  static SharedPool* pool = [] {
    auto* p = new SharedPool(static_cast<uint64_t>(paramSharedPoolBytes()));
    if (!p->failure_.empty()) {
      SMDDP_LOG(kWarn) << "smddp: no shared pool for allocate_tensor (" << p->failure_
                       << "): it returns private tensors, which peers read as any other";
    }
    if (p->base_) pthread_atfork(nullptr, nullptr, [] { forkedChild.store(true); });
    madePool.store(p, std::memory_order_release);
    return p;
  }();
  return *pool;
}

PoolWhere SharedPool::where() {
  const SharedPool* p = madePool.load(std::memory_order_acquire);
  if (!p || !p->base_ || forkedChild.load(std::memory_order_relaxed)) return {};
  return {reinterpret_cast<uint64_t>(p->base_), p->bytes_, p->fd_};
}

void* SharedPool::allocate(size_t bytes) {
  if (!base_ || forkedChild.load(std::memory_order_relaxed)) return nullptr;  // a forked child's
  const uint64_t want = (std::max<uint64_t>(bytes, 1) + kPage - 1) / kPage * kPage;
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t at = ranges_.take(want);
  return at == UINT64_MAX ? nullptr : base_ + at;
}

void SharedPool::release(void* p) {
  std::lock_guard<std::mutex> lock(mu_);
  ranges_.give(static_cast<uint64_t>(static_cast<uint8_t*>(p) - base_));
}

PoolScratch::~PoolScratch() {
  if (at_) SharedPool::process().release(at_);
}

uint8_t* PoolScratch::get(uint64_t bytes) {
  if (at_ && bytes <= bytes_) return static_cast<uint8_t*>(at_);
  SharedPool& pool = SharedPool::process();
  if (at_) pool.release(at_);
  at_ = pool.allocate(bytes);
  bytes_ = at_ ? bytes : 0;
  return static_cast<uint8_t*>(at_);
}

uint64_t SharedPool::inUse() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ranges_.inUse();
}

PeerPools::~PeerPools() {
  for (const Map& m : maps_) {
    if (m.at) munmap(const_cast<uint8_t*>(m.at), m.where.bytes);
  }
}

const uint8_t* PeerPools::find(int p, const PoolWhere& theirs, uint64_t remote, uint64_t len) {
  if (!theirs.contains(remote, len)) return nullptr;
  Map& m = maps_[static_cast<size_t>(p)];
  if (m.failed) return nullptr;
  if (!m.at || m.where.base != theirs.base || m.where.bytes != theirs.bytes) {
    // A process has one pool for its life, so this runs once per peer.
    if (m.at) munmap(const_cast<uint8_t*>(m.at), m.where.bytes);
    m.at = nullptr;
    const std::string path =
        "/proc/" + std::to_string(pids_[static_cast<size_t>(p)]) + "/fd/" + std::to_string(theirs.fd);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    void* at = fd < 0 ? MAP_FAILED : mmap(nullptr, theirs.bytes, PROT_READ, MAP_SHARED, fd, 0);
    const int err = errno;
    if (fd >= 0) close(fd);
    if (at == MAP_FAILED) {
      SMDDP_LOG(kWarn) << "smddp: cannot map local rank " << p << "'s shared pool (" << path
                       << ": " << std::strerror(err) << "); reading it with process_vm_readv";
      m.failed = true;
      return nullptr;
    }
    madvise(at, theirs.bytes, MADV_HUGEPAGE);  // map its huge pages whole (SharedPool)
    m.at = static_cast<const uint8_t*>(at);
    m.where = theirs;
  }
  return m.at + (remote - theirs.base);
}

}  // namespace smddp
