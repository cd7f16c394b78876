// All-gather and reduce-scatter among the ranks of one host, straight from
// each peer's buffer (docs/design.md, "All-gather and reduce-scatter on
// one host"). A rank posts where its input lies (DirectPost, in the host
// segment), and every rank copies what it needs from the others with
// cross-memory attach (process_vm_readv): all-gather moves each peer's
// part once, into the output; reduce-scatter reads the other ranks' parts
// of its own block once, a piece at a time into a buffer that stays in
// cache, and combines them in rank order with the reduction servers'
// kernel, so its result has the bits of the network path's. A rank leaves
// the call once every rank has read what it needs, so that its input may
// change again.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/allreduce_path.h"
#include "hostpath/host_segment.h"
#include "transport/bootstrap.h"

namespace smddp {

class EngineContext;
class StallWatch;

class SegmentCollectives final : public HostCollectives {
 public:
  // Why open() returned null.
  struct NotOpened {
    bool switchedOff = false;  // SMDDP_SHM_COLLECTIVES=0 on some rank, as asked
    std::string why;           // otherwise: what some rank could not do
  };
  // Collective over `bootstrap` (the group's key space; a group whose
  // ranks all share `segment`'s host), bounded by the group timeout: each
  // rank tries to read a peer's memory, and all agree. Null when
  // SMDDP_SHM_COLLECTIVES=0 on some rank or some rank could not read (a
  // kernel's ptrace rules, a seccomp filter), with `notOpened` saying which.
  static std::unique_ptr<SegmentCollectives> open(EngineContext& ctx, Bootstrap& bootstrap,
                                                  HostSegment& segment, NotOpened* notOpened);

  void allGather(EngineContext& ctx, uint64_t seq, Buffer in, const std::vector<Buffer>& outs,
                 DataType dtype) override;
  void reduceScatter(EngineContext& ctx, uint64_t seq, const std::vector<Buffer>& ins, Buffer out,
                     DataType dtype, ReduceOp op) override;
  std::string describe() const override;

 private:
  SegmentCollectives(HostSegment& segment, int rank, std::vector<pid_t> pids);
  // Publishes this rank's blocks for call `seq`.
  void post(uint64_t seq, const CollectiveSignature& sig, const std::vector<uint64_t>& blocks);
  // Waits until every rank posted call `seq`, and checks that they made
  // the same call (kMismatch naming the first that differs).
  void awaitPosts(EngineContext& ctx, StallWatch& watch, uint64_t seq,
                  const CollectiveSignature& sig);
  // Marks this rank's reads done and waits until every rank's are.
  void finish(EngineContext& ctx, StallWatch& watch, uint64_t seq, const CollectiveSignature& sig);
  void await(EngineContext& ctx, StallWatch& watch, uint64_t seq, const CollectiveSignature& sig,
             const std::function<bool(int)>& arrived);
  // Copies `bytes` at `remote` in rank `peer`'s memory to `local`.
  void read(int peer, void* local, uint64_t remote, uint64_t bytes, const StallWatch& watch) const;

  HostSegment& segment_;
  const int rank_;
  const int ranks_;
  const std::vector<pid_t> pids_;
  // A private copy of this rank's input when the output overlaps it in a
  // way the peers' reads would see; the pieces of the peers' parts.
  std::vector<uint8_t> snapshot_;
  std::vector<uint8_t> pieces_;
};

}  // namespace smddp
