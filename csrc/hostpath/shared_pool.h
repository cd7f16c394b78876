// Memory the other ranks of this host can read without a system call: the
// pool behind the backend's allocate_tensor (FSDP2's
// set_allocate_memory_from_process_group_for_comm), as NCCL's pool sits
// behind ncclMemAlloc. One per process, in a memfd of
// SMDDP_SHARED_POOL_BYTES reserved at its first allocation (pages are
// taken as they are touched; a forked child inherits no mapping of it).
// A rank posts where its pool lies with every
// all-gather and reduce-scatter (DirectPost::pool*); a peer whose block
// lies in it maps that pool once, read-only, through /proc/<pid>/fd (the
// ptrace rule process_vm_readv already needs) and copies with memcpy,
// where a private buffer costs a process_vm_readv that pins each page
// (2-3x a memcpy at 2-8 MiB on the development VM;
// benchmarks/cross_process_copy.cc).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace smddp {

// Where a process's pool lies in its own address space.
struct PoolWhere {
  uint64_t base = 0;  // 0: the process has no pool
  uint64_t bytes = 0;
  int fd = -1;  // its memfd, in that process
  bool contains(uint64_t at, uint64_t len) const {
    return base != 0 && at >= base && len <= bytes && at - base <= bytes - len;
  }
};

class SharedPool {
 public:
  // The process's pool, made at the first call (never destroyed: tensors
  // may outlive every process group).
  static SharedPool& process();
  // Where the process's pool lies, without making it.
  static PoolWhere where();

  // `bytes` rounded up to whole pages, page-aligned; null when the pool
  // has no free range that large, could not be made, or belongs to the
  // parent of this forked process (the caller then allocates privately).
  void* allocate(size_t bytes);
  // Returns what allocate() gave.
  void release(void* p);
  // Bytes handed out and not released (tests, stats).
  uint64_t inUse() const;
  // Why the pool could not be made, or "".
  const std::string& failure() const { return failure_; }

  // The allocator alone, over offsets [0, bytes), for tests.
  class Ranges {
   public:
    explicit Ranges(uint64_t bytes);
    // First fit; UINT64_MAX when nothing is large enough.
    uint64_t take(uint64_t bytes);
    void give(uint64_t offset);  // merges with free neighbours
    uint64_t inUse() const { return inUse_; }
    size_t freeRanges() const { return free_.size(); }

   private:
    std::map<uint64_t, uint64_t> free_;  // offset -> bytes
    std::map<uint64_t, uint64_t> used_;
    uint64_t inUse_ = 0;
  };

 private:
  explicit SharedPool(uint64_t bytes);

  mutable std::mutex mu_;
  uint8_t* base_ = nullptr;
  uint64_t bytes_ = 0;
  int fd_ = -1;
  std::string failure_;
  Ranges ranges_;
};

// A range of the process's pool kept for reuse (staging copies the peers
// read), grown on demand and released when it goes.
class PoolScratch {
 public:
  PoolScratch() = default;
  ~PoolScratch();
  PoolScratch(const PoolScratch&) = delete;
  PoolScratch& operator=(const PoolScratch&) = delete;
  // At least `bytes` of the pool, or null: no pool, none free that large,
  // or the pool of the parent of this forked process.
  uint8_t* get(uint64_t bytes);
  // How large the range get() holds is (0: none).
  uint64_t bytes() const { return bytes_; }
  // Lets the range go without returning it to the pool, which keeps it
  // taken for the process's life: a peer may still read it.
  void keep() {
    at_ = nullptr;
    bytes_ = 0;
  }

 private:
  void* at_ = nullptr;
  uint64_t bytes_ = 0;
};

// A rank's read-only mappings of its host peers' pools, made on first
// use and kept until the rank's collectives go.
class PeerPools {
 public:
  explicit PeerPools(std::vector<pid_t> pids) : pids_(std::move(pids)), maps_(pids_.size()) {}
  ~PeerPools();
  PeerPools(const PeerPools&) = delete;
  PeerPools& operator=(const PeerPools&) = delete;

  // Where `remote` (len bytes in local rank p's memory) can be read here,
  // or null: not in p's pool `theirs`, or that pool cannot be mapped (then
  // never tried again).
  const uint8_t* find(int p, const PoolWhere& theirs, uint64_t remote, uint64_t len);

 private:
  struct Map {
    PoolWhere where;
    const uint8_t* at = nullptr;
    bool failed = false;
  };
  std::vector<pid_t> pids_;
  std::vector<Map> maps_;
};

}  // namespace smddp
