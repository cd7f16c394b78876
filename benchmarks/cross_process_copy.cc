// The bound a one-host all-gather meets on this machine
// (hostpath/host_collectives.h): two processes at once, each copying the
// other's buffer into its own with one process_vm_readv, against each
// copying its own buffer with memcpy (the bench's `copy` floor), and
// against each copying the other's buffer with memcpy from a mapping both
// share (what a buffer allocated in shared memory, as a backend's
// allocate_tensor could give, would cost). A buffer private to its process
// needs one cross-process copy at least; through a shared segment it
// takes two. Checks the bytes each copy brought, then prints the best of
// the iterations. A fourth way is the route for a private buffer through
// shared memory, which staging takes (hostpath/host_collectives.h): each
// process copies its own buffer into its shared one, both meet, and each
// copies the other's shared copy into its own: two copies and a meeting.
// With `huge`, each process's own buffers (not the shared ones) are
// 2 MiB aligned and madvised MADV_HUGEPAGE, as numpy's large arrays are
// and torch's with THP_MEM_ALLOC_ENABLE=1: the kernel then pins 512 times
// fewer pages per read (docs/notes/2026-12-07-private-bound.md).
//   build/smddp_cross_process_copy [MiB] [iterations] [huge]
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

// `bytes` of private memory filled with `value`: page-aligned, or with
// `huge` 2 MiB aligned and madvised for transparent huge pages (which the
// kernel gives where THP is "madvise" or "always").
uint8_t* ownBuffer(size_t bytes, uint8_t value, bool huge) {
  void* p = nullptr;
  if (posix_memalign(&p, huge ? size_t{2} << 20 : 4096, bytes) != 0) std::exit(2);
  if (huge) madvise(p, bytes, MADV_HUGEPAGE);
  std::memset(p, value, bytes);
  return static_cast<uint8_t*>(p);
}

double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Both processes pass this point together (one byte each way).
void meet(int in, int out) {
  char b = 0;
  if (write(out, &b, 1) != 1 || read(in, &b, 1) != 1) std::exit(3);
}

}  // namespace

int main(int argc, char** argv) {
  const size_t bytes = (argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 32) << 20;
  const int iters = argc > 2 ? std::atoi(argv[2]) : 16;
  const bool huge = argc > 3 && std::strcmp(argv[3], "huge") == 0;
  int down[2], up[2];
  if (pipe(down) != 0 || pipe(up) != 0) return 2;
  // Two buffers both processes map: the parent's first, the child's second.
  auto* shared = static_cast<uint8_t*>(
      mmap(nullptr, 2 * bytes + 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (shared == MAP_FAILED) return 2;
  const pid_t pid = fork();
  const bool child = pid == 0;
  const int in = child ? down[0] : up[0];
  const int out = child ? up[1] : down[1];
  uint8_t* const src = ownBuffer(bytes, child ? 1 : 2, huge);
  uint8_t* const dst = ownBuffer(bytes, 0, huge);
  // Where this process's source lies, for the other.
  const uint64_t mine[2] = {reinterpret_cast<uint64_t>(src),
                            static_cast<uint64_t>(getpid())};
  uint64_t theirs[2];
  if (write(out, mine, sizeof(mine)) != sizeof(mine) ||
      read(in, theirs, sizeof(theirs)) != sizeof(theirs)) {
    return 3;
  }
  uint8_t* ownShared = shared + (child ? bytes : 0);
  const uint8_t* theirShared = shared + (child ? 0 : bytes);
  const uint8_t mark = child ? 1 : 2, theirMark = child ? 2 : 1;
  // The staged way meets as a collective does, spinning on a word each in
  // the shared mapping (a pipe's wake-up costs up to half a millisecond
  // here): each counts its arrivals and waits for the other's count.
  auto* arrivals = reinterpret_cast<std::atomic<uint64_t>*>(shared + 2 * bytes);
  std::atomic<uint64_t>& myArrivals = arrivals[child ? 1 : 0];
  const std::atomic<uint64_t>& theirArrivals = arrivals[child ? 0 : 1];
  auto spinMeet = [&] {
    const uint64_t n = myArrivals.fetch_add(1, std::memory_order_acq_rel) + 1;
    while (theirArrivals.load(std::memory_order_acquire) < n) {
    }
  };
  // Each timed copy starts from a source its owner has just written, as a
  // collective's input is (so no copy finds the source in its cache from
  // the iteration before), with both processes at the same point.
  auto timed = [&](uint8_t* own, auto copy) {
    std::memset(own, mark, bytes);
    meet(in, out);
    const double t = seconds();
    copy();
    return seconds() - t;
  };
  double bestRead = 1e9, bestCopy = 1e9, bestShared = 1e9, bestStaged = 1e9;
  for (int i = 0; i < iters; ++i) {
    bestRead = std::min(bestRead, timed(src, [&] {
      iovec l{dst, bytes};
      iovec r{reinterpret_cast<void*>(theirs[0]), bytes};
      if (process_vm_readv(static_cast<pid_t>(theirs[1]), &l, 1, &r, 1, 0) !=
          static_cast<ssize_t>(bytes)) {
        std::perror("process_vm_readv");
        std::exit(1);
      }
    }));
    if (dst[bytes / 2] != theirMark) return 4;  // the other's bytes
    meet(in, out);
    bestCopy = std::min(bestCopy, timed(src, [&] { std::memcpy(dst, src, bytes); }));
    meet(in, out);
    bestShared = std::min(bestShared, timed(ownShared, [&] { std::memcpy(dst, theirShared, bytes); }));
    if (dst[bytes / 2] != theirMark) return 5;
    meet(in, out);
    std::memset(dst, 0, bytes);
    bestStaged = std::min(bestStaged, timed(src, [&] {
      std::memcpy(ownShared, src, bytes);
      spinMeet();
      std::memcpy(dst, theirShared, bytes);
    }));
    if (dst[bytes / 2] != theirMark) return 6;
    meet(in, out);
  }
  meet(in, out);
  std::printf(
      "%s: %zu MiB%s, process_vm_readv %.3f ms, memcpy %.3f ms, ratio %.2f; memcpy from the "
      "other's shared buffer %.3f ms, ratio %.2f; staged (own copy into the shared buffer, "
      "meet, memcpy from the other's) %.3f ms, ratio %.2f\n",
      child ? "child " : "parent", bytes >> 20, huge ? " (huge pages)" : "", bestRead * 1e3, bestCopy * 1e3,
      bestRead / bestCopy, bestShared * 1e3, bestShared / bestCopy, bestStaged * 1e3,
      bestStaged / bestCopy);
  if (!child) waitpid(pid, nullptr, 0);
  std::free(src);
  std::free(dst);
  return 0;
}
