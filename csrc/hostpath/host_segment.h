// The shared-memory segment of a process group whose ranks all live on one
// host. It carries the fusion plans the leader publishes, each rank's
// progress counters, and the reduction servers' receive and result slots.
// Ranks synchronise through atomics in it and sleep on a futex in it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/allreduce_path.h"  // kMaxFusedCalls: a plan holds that many calls
#include "hostpath/arrivals.h"
#include "transport/bootstrap.h"

namespace smddp {

constexpr int kHostMaxRanks = 64;
constexpr int kPlanDepth = 4;
constexpr size_t kAbortTextBytes = 2048;
// How a rank's status starts when /dev/shm cannot hold the segment (the
// caller then tells the user about --shm-size).
constexpr const char* kNoRoomText = "no room in /dev/shm for the ";

// A counter on its own cache line: written by one rank, read by all.
struct alignas(64) SharedCounter {
  std::atomic<uint64_t> value{0};
};

// One fusion buffer as the leader cut it: which calls, and where its steps
// fall in the group's global step count. Slot b % kPlanDepth holds batch b.
struct alignas(64) FusionPlan {
  std::atomic<uint64_t> published{0};  // batch + 1 once the fields below are valid
  uint64_t firstSeq = 0;
  uint64_t firstStep = 0;
  uint64_t steps = 0;
  uint64_t totalNumel = 0;
  uint32_t count = 0;
  uint8_t dtype = 0;
  uint8_t op = 0;
  uint8_t small = 0;  // one step, every rank reduces every part (SMDDP_SMALL_BYTES)
  uint64_t numel[kMaxFusedCalls] = {};
  // Any rank that cannot run this batch (mismatch, timeout, lost peer)
  // records why; every rank checks before it returns success.
  std::atomic<uint64_t> aborted{0};  // batch + 1 when aborted
  std::atomic<uint32_t> abortLock{0};
  // The aborting rank's group is unusable (its error was a timeout, a lost
  // peer, ...), not just this batch: the others fail it as kAborted.
  uint8_t abortBreaks = 0;
  char abortText[kAbortTextBytes] = {};
};

// Where one rank's input of an all-gather or reduce-scatter lies in its
// own address space, for the host's other ranks to read directly
// (hostpath/host_collectives.h). Written by that rank only.
constexpr int kLandedSeqShift = 24;
struct alignas(64) DirectPost {
  // The step's flag (SegmentCollectives::flagOf: the call's seq, and its
  // piece for a call in pieces) once the fields below are valid.
  std::atomic<uint64_t> posted{0};
  // Across hosts, an all-gather's chunks of host h's part that arrived
  // here, in order from the first: (seq + 1) << kLandedSeqShift | count.
  std::atomic<uint64_t> landed[kHostMaxRanks] = {};
  uint64_t numel = 0;               // elements per block
  uint8_t collective = 0;
  uint8_t dtype = 0;
  uint8_t op = 0;
  // All-gather: block[h] holds host h's part (this rank's input for its
  // own host); reduce-scatter: rank r's block, or where block 0 lies.
  uint64_t block[kHostMaxRanks] = {};
  // All-gather on one host: this rank's ring position (gatherWritten) when
  // the call began; its part's chunk k goes to ring position ringStart + k.
  uint64_t ringStart = 0;
  // Where this rank's process pool lies (hostpath/shared_pool.h), base 0
  // if it has none: a block inside it is read from a mapping of it.
  uint64_t poolBase = 0;
  uint64_t poolBytes = 0;
  int64_t poolFd = -1;
};

// All-gather on one host streams each rank's part through a ring of its
// own in the segment, kGatherSlots slots of kGatherSlotBytes: the writer
// copies a chunk in once, every peer copies it out while it is still in
// cache. Positions count chunks from the segment's start, across calls.
// (4 x 64 KiB and 16 x 256 KiB measured the same as 8 x 128 KiB.)
constexpr uint64_t kGatherSlots = 8;
constexpr uint64_t kGatherSlotBytes = uint64_t{128} << 10;
// By reader: how many chunks of each rank's ring it has copied out.
struct alignas(64) GatherReads {
  std::atomic<uint64_t> of[kHostMaxRanks] = {};
};

struct SegmentControl {
  uint64_t magic;
  uint32_t ranks;
  uint32_t servers;
  uint64_t slotBytes;
  uint64_t depth;
  uint64_t totalBytes;
  std::atomic<uint32_t> wake{0};      // futex word: bumped on every publish
  std::atomic<uint32_t> sleepers{0};  // ranks inside futex wait
  FusionPlan plans[kPlanDepth];
  SharedCounter arrived[kHostMaxRanks];   // batches this rank has joined
  SharedCounter written[kHostMaxRanks];   // steps whose contributions it wrote
  SharedCounter reduced[kHostMaxRanks];   // steps it reduced as a server
  SharedCounter consumed[kHostMaxRanks];  // steps whose results it copied out
  // Collectives this rank's caller has issued (its next sequence number).
  // A batch only fuses calls every rank has issued: a rank whose caller
  // waits on call k before issuing k + 1 is never asked for k + 1 early.
  SharedCounter issued[kHostMaxRanks];
  // When each rank issued its recent collectives, and who was last.
  ArrivalBoard arrivals;
  // By slot, then rank: a step posts in slot (seq + piece) % 2, so a rank
  // that left a small all-gather before its peers read it may post its
  // next step while they still read this one (host_collectives.h).
  DirectPost direct[2][kHostMaxRanks];
  // The flag of the last step each rank left: it reads nothing more of
  // the peers' posts and blocks of that step or any before.
  SharedCounter directDone[kHostMaxRanks];
  // By local rank q: bit p once local rank p has mapped q's shared pool,
  // and so can read what q staged there even after q's process ended.
  std::atomic<uint64_t> poolMappedBy[kHostMaxRanks] = {};
  SharedCounter gatherWritten[kHostMaxRanks];  // chunks this rank put in its ring
  GatherReads gatherRead[kHostMaxRanks];
};
static_assert(kArrivalMaxRanks == kHostMaxRanks);

class HostSegment {
 public:
  // Rank 0 creates the segment and publishes its name through `bootstrap`;
  // the others map it. Once every rank has mapped it, the name is unlinked,
  // so nothing outlives the processes. Rank 0 reserves every page up front
  // (posix_fallocate). Throws when shared memory is unavailable or too
  // small (the caller then keeps the network path); a throw leaves neither
  // the name nor a mapping behind. The name is "/smddp-<ownerTag>-seg-"
  // and 32 random hex digits (O_EXCL, mode 0600), so the sweeper
  // (transport/shm_owner.h) knows whose it is and nobody who lists
  // /dev/shm learns anything else from it.
  HostSegment(Bootstrap& bootstrap, int rank, int ranks, int servers, uint64_t slotBytes,
              int depth, const std::string& ownerTag, std::chrono::milliseconds timeout);
  ~HostSegment();
  HostSegment(const HostSegment&) = delete;
  HostSegment& operator=(const HostSegment&) = delete;

  // The bytes a segment of this geometry takes in /dev/shm.
  static size_t bytesFor(int ranks, int servers, uint64_t slotBytes, uint64_t depth);

  SegmentControl& ctl() { return *ctl_; }
  int ranks() const { return ranks_; }
  int servers() const { return servers_; }
  int serverRank(int server) const { return server * ranks_ / servers_; }
  // The server index rank `rank` runs, or -1.
  int serverIndexOf(int rank) const;
  uint64_t slotBytes() const { return slotBytes_; }
  uint64_t depth() const { return depth_; }

  // Where rank `rank` puts its part of step `step` for server `server`.
  uint8_t* contribution(int server, int rank, uint64_t step) const;
  // Where server `server` puts the reduced result of step `step`.
  uint8_t* result(int server, uint64_t step) const;
  // Slot of rank `rank`'s all-gather ring that holds ring position `pos`.
  uint8_t* gatherSlot(int rank, uint64_t pos) const;

  // Stores `v` and wakes sleepers.
  void publish(SharedCounter& c, uint64_t v);
  void wakeAll();
  uint32_t wakeValue() const { return ctl_->wake.load(std::memory_order_seq_cst); }
  // Watches the wake word for about 2 us (between two sched_yield calls of
  // a polling wait); true once it differs from `seen`.
  bool watchWake(uint32_t seen) const;
  // Sleeps until the wake word differs from `seen`, at most `maxWait`.
  void sleep(uint32_t seen, std::chrono::microseconds maxWait);

 private:
  int rank_;
  int ranks_;
  int servers_;
  uint64_t slotBytes_;
  uint64_t depth_;
  size_t bytes_ = 0;
  void* base_ = nullptr;
  SegmentControl* ctl_ = nullptr;
  uint8_t* data_ = nullptr;
};

}  // namespace smddp
