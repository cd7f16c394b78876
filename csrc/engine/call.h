// What a caller hands the engine with one call: its buffers, the memory
// the call touches, and the hooks it may add. Shared by the Communicator's
// entry points (communicator.h), the algorithms' (algorithms/
// collective_calls.h) and the allreduce paths (allreduce_path.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace smddp {

// "<call> at sequence <seq> in group '<group>'": how every error names a
// call, so that a process with several groups can tell which one failed.
inline std::string callAt(const std::string& group, const std::string& call, uint64_t seq) {
  return call + " at sequence " + std::to_string(seq) + " in group '" + group + "'";
}

struct Buffer {
  void* data = nullptr;
  uint64_t numel = 0;
  // The caller's hint that the memory lies on transparent huge pages (a
  // torch tensor allocated with THP_MEM_ALLOC_ENABLE=1): the kernel then
  // copies it to another process at about a memcpy's cost, so a large
  // all-gather part is read where it lies instead of staged
  // (SegmentCollectives::readsInPlace).
  bool hugePages = false;
};

// Bytes [begin, end) of the caller's memory that a call reads or writes.
struct MemRange {
  uintptr_t begin = 0;
  uintptr_t end = 0;
  bool overlaps(const MemRange& o) const { return begin < o.end && o.begin < end; }
};

// What a caller may add to a call. The torch backend hands the engine
// private staging copies of non-contiguous (or pre-scaled) tensors, so the
// engine cannot see from the buffers alone that two calls touch the same
// storage: `touches` names the caller's memory instead (empty: the
// buffers; only allreduce, which may be fused, looks at it). `prepare`
// runs on the worker thread just before the call's buffers are first
// read, after every earlier call has completed (and run its `done`), so a
// staging copy-in sees the results of the calls before it: call order, for
// every collective and for sends.
// `callerWaits`: the caller blocks on this call as soon as it returns (a
// synchronous call: c10d's async_op=False, allreduceSync). If the engine
// thread is idle and nothing is queued, the call then runs on the caller's
// thread, inside allreduce(), and `done` has run when it returns: no
// handoff to the engine thread and back (docs/design.md, "The allreduce
// path"). It runs exactly as the engine would run it (same plan, same
// checks), so peers cannot tell which thread ran it.
struct CallHooks {
  std::vector<MemRange> touches;
  std::function<void()> prepare;
  bool callerWaits = false;
};

}  // namespace smddp
