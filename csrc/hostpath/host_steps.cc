// How the ranks of a host step through a one-host call together
// (SegmentCollectives, host_collectives.h): each posts its blocks in the
// step's slot, waits for the others' posts, and marks when it leaves.
// A small all-gather leaves before its peers read its staged copy, so a
// later step that would overwrite that slot or copy waits for them here
// first (docs/design.md, "Small all-gathers leave early").
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "common/caller_waiting.h"
#include "common/error.h"
#include "common/process.h"
#include "engine/engine_context.h"
#include "engine/stall_watch.h"
#include "hostpath/fusion_batch.h"
#include "hostpath/host_collectives.h"

namespace smddp {

void SegmentCollectives::post(uint64_t seq, const CollectiveSignature& sig,
                              const std::vector<uint64_t>& blocks) {
  DirectPost& p = segment_.ctl().direct[slot_][local_];
  p.numel = sig.numel;
  p.collective = static_cast<uint8_t>(sig.collective);
  p.dtype = static_cast<uint8_t>(sig.dtype);
  p.op = static_cast<uint8_t>(sig.op);
  std::copy(blocks.begin(), blocks.end(), p.block);
  p.ringStart = segment_.ctl().gatherWritten[local_].value.load(std::memory_order_relaxed);
  const PoolWhere pool = SharedPool::where();
  p.poolBase = pool.base;
  p.poolBytes = pool.bytes;
  p.poolFd = pool.fd;
  p.posted.store(flagOf(seq), std::memory_order_release);
  segment_.wakeAll();
}

void SegmentCollectives::drive(EngineContext& ctx, StallWatch& watch, uint64_t seq,
                               const CollectiveSignature& sig, const std::function<Turn()>& turn,
                               const std::function<std::vector<int>()>& behind) {
  using clock = std::chrono::steady_clock;
  const auto spin = std::chrono::microseconds(ctx.config().spinUs);
  auto idleSince = clock::now();
  auto nextCheck = idleSince;
  while (true) {
    const uint32_t seen = segment_.wakeValue();
    const Turn t = turn();
    if (t == Turn::kDone) return;
    if (ctx.waits().stopRequested()) {
      throwError(ErrorKind::kAborted, "smddp: " + watch.what() + ": the process group was shut down");
    }
    const auto now = clock::now();
    if (now >= nextCheck) {  // error frames, probes, the deadline, liveness
      nextCheck = now + std::chrono::microseconds(100);
      ctx.progress();
      watch.check(seq, &sig, 1, [&] { return rankList(behind()); },
                  [&] { return "not seen at this call: " + rankList(behind()); });
    }
    if (t == Turn::kMoved) {
      idleSince = now;
      continue;
    }
    if (now - idleSince < spin && aCallerIsWaiting()) {
      if (!segment_.watchWake(seen)) sched_yield();
      continue;
    }
    segment_.sleep(seen, std::chrono::microseconds(2000));
  }
}

void SegmentCollectives::await(EngineContext& ctx, StallWatch& watch, uint64_t seq,
                               const CollectiveSignature& sig,
                               const std::function<bool(int)>& arrived) {
  drive(
      ctx, watch, seq, sig,
      [&] {
        for (int p = 0; p < ranks_; ++p) {
          if (!arrived(p)) return Turn::kIdle;
        }
        return Turn::kDone;
      },
      [&] {  // for messages: group ranks
        std::vector<int> ranks;
        for (int p = 0; p < ranks_; ++p) {
          if (!arrived(p)) ranks.push_back(globalRank(topo_.hostIndex, p));
        }
        return ranks;
      });
}

void SegmentCollectives::awaitPosts(EngineContext& ctx, StallWatch& watch, uint64_t seq,
                                    const CollectiveSignature& sig) {
  SegmentControl& ctl = segment_.ctl();
  await(ctx, watch, seq, sig, [&](int p) {
    return ctl.direct[slot_][p].posted.load(std::memory_order_acquire) == flagOf(seq);
  });
  for (int p = 0; p < ranks_; ++p) {
    const DirectPost& d = postOf(p);
    const CollectiveSignature theirs{static_cast<CollectiveType>(d.collective),
                                     static_cast<DataType>(d.dtype), static_cast<ReduceOp>(d.op),
                                     d.numel, -1};
    if (theirs == sig) continue;
    // Every rank of the host sees every post, so every one fails here.
    throwError(ErrorKind::kMismatch,
               "smddp: " + watch.what() + ": rank " +
                   std::to_string(globalRank(topo_.hostIndex, p)) + " called " +
                   theirs.describe() + " at sequence " + std::to_string(seq) +
                   " but this rank called " + sig.describe() + " (collective mismatch)");
  }
}

void SegmentCollectives::markDone(uint64_t seq) {
  segment_.ctl().directDone[local_].value.store(flagOf(seq), std::memory_order_release);
  segment_.wakeAll();
}

void SegmentCollectives::awaitDone(EngineContext& ctx, StallWatch& watch, uint64_t seq,
                                   const CollectiveSignature& sig, uint64_t flag) {
  const SegmentControl& ctl = segment_.ctl();
  await(ctx, watch, seq, sig, [&](int p) {
    return ctl.directDone[p].value.load(std::memory_order_acquire) >= flag;
  });
}

void SegmentCollectives::claimSlot(EngineContext& ctx, StallWatch& watch, uint64_t seq,
                                   const CollectiveSignature& sig, uint64_t eager) {
  slot_ = static_cast<int>((seq + piece_) & 1);
  // An eager step keeps to its half of stage_ unless stage_ must grow.
  const bool both = eager == 0 || stage_.bytes() < 2 * eager;
  const uint64_t flag = both ? std::max(earlyFlag_[0], earlyFlag_[1]) : earlyFlag_[slot_];
  if (flag == 0) return;
  awaitDone(ctx, watch, seq, sig, flag);
  if (both) {
    earlyFlag_[0] = earlyFlag_[1] = 0;
  } else {
    earlyFlag_[slot_] = 0;
  }
}

uint64_t SegmentCollectives::eagerBytes(const EngineContext& ctx, uint64_t bytes) const {
  const HostPathConfig& c = hostPathConfig(ctx.config());
  const uint64_t everyone = ranks_ == 64 ? ~uint64_t{0} : (uint64_t{1} << ranks_) - 1;
  const bool eager =
      hosts() == 1 && ranks_ > 1 && bytes > 0 && bytes <= c.eagerBytes && c.stageBytes > 0 &&
      (segment_.ctl().poolMappedBy[local_].load(std::memory_order_acquire) |
       (uint64_t{1} << local_)) == everyone;
  return eager ? c.eagerBytes : 0;
}

bool SegmentCollectives::allLeft(uint64_t flag) const {
  const SegmentControl& ctl = segment_.ctl();
  for (int p = 0; p < ranks_; ++p) {
    // A peer whose process ended (a zombie too) reads nothing more.
    if (ctl.directDone[p].value.load(std::memory_order_acquire) < flag &&
        !processExited(pids_[p])) {
      return false;
    }
  }
  return true;
}

SegmentCollectives::~SegmentCollectives() {
  // Another group of this process may take the range and write it once
  // it is back in the pool. A peer that has not left within 2 s is dead
  // or stuck in its call, and the range stays taken.
  const uint64_t flag = std::max(earlyFlag_[0], earlyFlag_[1]);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (flag != 0 && !allLeft(flag)) {
    if (std::chrono::steady_clock::now() >= until) {
      stage_.keep();
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

uint8_t* SegmentCollectives::stageRange(uint64_t bytes, uint64_t eager) {
  if (eager == 0) return stage_.get(bytes);
  uint8_t* at = stage_.get(2 * eager);
  return at ? at + slot_ * eager : nullptr;
}

}  // namespace smddp
