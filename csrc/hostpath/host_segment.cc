#include "hostpath/host_segment.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <new>

#include "common/crypto.h"
#include "common/error.h"

namespace smddp {

namespace {

constexpr uint64_t kSegmentMagic = 0x534d444450534547ull;  // "SMDDPSEG"

size_t controlBytes() { return (sizeof(SegmentControl) + 4095) & ~size_t{4095}; }

std::string errnoText(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

}  // namespace

size_t HostSegment::bytesFor(int ranks, int servers, uint64_t slotBytes, uint64_t depth) {
  // servers x ranks contribution slots and servers result slots, per
  // depth; then each rank's all-gather ring.
  uint64_t slots = static_cast<uint64_t>(servers) * (static_cast<uint64_t>(ranks) + 1) * depth;
  return controlBytes() + slots * slotBytes + static_cast<uint64_t>(ranks) * kGatherSlots * kGatherSlotBytes;
}

namespace {

// Owns a mapping and, on rank 0, the segment's name until the constructor
// succeeds: whatever throws on the way (a peer that never maps, a timeout)
// leaves neither a name in /dev/shm nor an address range behind.
struct SegmentGuard {
  std::string name;  // unlinked on destruction while non-empty
  void* base = nullptr;
  size_t bytes = 0;
  ~SegmentGuard() {
    if (base) munmap(base, bytes);
    if (!name.empty()) shm_unlink(name.c_str());
  }
};

std::string mib(size_t bytes) {
  char buf[32];
  snprintf(buf, sizeof(buf), "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

// Rank 0's part of making the segment: create `name` and reserve its
// guard.bytes. Returns "ok" or why not; `fd` is open once shm_open succeeded.
std::string createSegment(const std::string& name, SegmentGuard& guard, int& fd) {
  fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return errnoText("shm_open");
  guard.name = name;
  if (ftruncate(fd, static_cast<off_t>(guard.bytes)) != 0) return errnoText("ftruncate");
  if (int rc = posix_fallocate(fd, 0, static_cast<off_t>(guard.bytes)); rc != 0) {
    return std::string(kNoRoomText) + mib(guard.bytes) + " shared-memory segment (" +
           std::strerror(rc) + ")";
  }
  return "ok";
}

}  // namespace

HostSegment::HostSegment(Bootstrap& bootstrap, int rank, int ranks, int servers,
                         uint64_t slotBytes, int depth, const std::string& ownerTag,
                         std::chrono::milliseconds timeout)
    : rank_(rank), ranks_(ranks), servers_(servers), slotBytes_(slotBytes), depth_(depth) {
  SMDDP_CHECK(ranks >= 1 && ranks <= kHostMaxRanks, kInvalidArgument,
              "shared-memory path supports at most " + std::to_string(kHostMaxRanks) + " ranks");
  SMDDP_CHECK(servers >= 1 && servers <= ranks && depth >= 1 && slotBytes >= 64 &&
                  slotBytes % 64 == 0,
              kInternal, "bad shared-memory segment geometry");
  bytes_ = bytesFor(ranks, servers, slotBytes, depth_);
  // A random name, made by rank 0 and published to the host's ranks only
  // through the bootstrap: anyone may list /dev/shm, and the name must tell
  // them nothing (no job secret, nothing to guess a later name from).
  std::string name;
  SegmentGuard guard;
  guard.bytes = bytes_;

  // 1. Rank 0 creates the segment and reserves its pages; everyone learns
  //    whether it could. Without the reservation a /dev/shm too small (64 MiB
  //    in a default Docker container) would let ftruncate succeed and then
  //    SIGBUS the first write past the end of the free space.
  std::string status = "ok";
  int fd = -1;
  if (rank == 0) {
    name = "/smddp-" + ownerTag + "-seg-" + randomHex(16);
    status = createSegment(name, guard, fd);
    bootstrap.set("hostseg/name", name);
    bootstrap.set("hostseg/created", status);
  } else {
    status = bootstrap.get("hostseg/created", timeout);
    if (status == "ok") {
      name = bootstrap.get("hostseg/name", timeout);
      fd = shm_open(name.c_str(), O_RDWR, 0600);
      if (fd < 0) status = errnoText("shm_open");
    }
  }
  if (fd >= 0 && status == "ok") {
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) status = errnoText("mmap");
    else guard.base = p;
  }
  if (fd >= 0) close(fd);
  ctl_ = static_cast<SegmentControl*>(guard.base);
  if (rank == 0 && guard.base) {
    new (ctl_) SegmentControl();
    ctl_->ranks = ranks;
    ctl_->servers = servers;
    ctl_->slotBytes = slotBytes;
    ctl_->depth = depth_;
    ctl_->totalBytes = bytes_;
    std::atomic_thread_fence(std::memory_order_release);
    ctl_->magic = kSegmentMagic;
  }
  // 2. Everyone has mapped it (or failed to): the name can go.
  auto all = bootstrapAllGather(bootstrap, rank, ranks, "hostseg/mapped", status, timeout);
  if (rank == 0) {
    shm_unlink(name.c_str());
    guard.name.clear();
  }
  for (int r = 0; r < ranks; ++r) {
    if (all[r] != "ok") {
      throwError(ErrorKind::kTransport,
                 "shared-memory segment unavailable on rank " + std::to_string(r) + ": " + all[r]);
    }
  }
  std::atomic_thread_fence(std::memory_order_acquire);
  SMDDP_CHECK(ctl_->magic == kSegmentMagic && ctl_->totalBytes == bytes_, kInternal,
              "shared-memory segment has an unexpected layout");
  base_ = guard.base;
  guard.base = nullptr;  // the segment owns the mapping from here on
  data_ = static_cast<uint8_t*>(base_) + controlBytes();
}

HostSegment::~HostSegment() {
  if (base_) munmap(base_, bytes_);
}

int HostSegment::serverIndexOf(int rank) const {
  for (int s = 0; s < servers_; ++s) {
    if (serverRank(s) == rank) return s;
  }
  return -1;
}

uint8_t* HostSegment::contribution(int server, int rank, uint64_t step) const {
  uint64_t slot = (static_cast<uint64_t>(server) * ranks_ + rank) * depth_ + step % depth_;
  return data_ + slot * slotBytes_;
}

uint8_t* HostSegment::result(int server, uint64_t step) const {
  uint64_t slot = static_cast<uint64_t>(servers_) * ranks_ * depth_ +
                  static_cast<uint64_t>(server) * depth_ + step % depth_;
  return data_ + slot * slotBytes_;
}

uint8_t* HostSegment::gatherSlot(int rank, uint64_t pos) const {
  const uint64_t slots = static_cast<uint64_t>(servers_) * (ranks_ + 1) * depth_;
  return data_ + slots * slotBytes_ + (rank * kGatherSlots + pos % kGatherSlots) * kGatherSlotBytes;
}

void HostSegment::publish(SharedCounter& c, uint64_t v) {
  c.value.store(v, std::memory_order_seq_cst);
  wakeAll();
}

void HostSegment::wakeAll() {
  ctl_->wake.fetch_add(1, std::memory_order_seq_cst);
  if (ctl_->sleepers.load(std::memory_order_seq_cst) > 0) {
    syscall(SYS_futex, &ctl_->wake, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
  }
}

bool HostSegment::watchWake(uint32_t seen) const {
  constexpr int kPolls = 64;  // about 2 us of pause instructions
  for (int i = 0; i < kPolls; ++i) {
    if (wakeValue() != seen) return true;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield" ::: "memory");
#endif
  }
  return false;
}

void HostSegment::sleep(uint32_t seen, std::chrono::microseconds maxWait) {
  ctl_->sleepers.fetch_add(1, std::memory_order_seq_cst);
  if (ctl_->wake.load(std::memory_order_seq_cst) == seen) {
    timespec ts{static_cast<time_t>(maxWait.count() / 1000000),
                static_cast<long>(maxWait.count() % 1000000) * 1000};
    syscall(SYS_futex, &ctl_->wake, FUTEX_WAIT, seen, &ts, nullptr, 0);
  }
  ctl_->sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

}  // namespace smddp
