// NCCL's API (nccl_api.h) simulated on the simulated device
// (sim_device.h), under NCCL's rules, so that CI catches what NCCL would
// do to the intra-host communicator (nccl_host.h):
// - a non-blocking communicator answers kInProgress at random from init
//   and from collectives; the init then completes, and the collective's
//   kernel is queued on its stream, later, from another thread;
// - a call made while the previous one is still in progress fails with
//   kInvalidArgument ("use of communicator before the previous operation
//   returned ncclSuccess"), as NCCL's does, and is recorded as a broken
//   rule (sim::violations());
// - the kernels of one communicator run in issue order, whatever streams
//   they were queued on; each is a kernel on the simulated device, so it
//   holds its hardware queue while it waits for the host's other ranks,
//   and several communicators share the device's queues;
// - a collective that cannot complete (a peer died, the exchange failed)
//   hangs, holding its queue, until the communicator is aborted; no error
//   says so (NVLink has no one to tell);
// - asynchronous errors (a test hook) appear through commGetAsyncError;
//   the kernel that met one hangs too, until the abort;
// - commAbort ends every kernel of the communicator at once, from any
//   thread, also one a launch under CUDA_LAUNCH_BLOCKING waits for; using
//   a communicator after commAbort or commDestroy is a broken rule (but
//   for a call that raced the abort: SimNcclOptions::abortGrace).
// The data moves through SimNcclPeers, which the caller provides: a CPU
// group of the host's ranks on the stand-in (backend/sim_intra.cc), memory
// shared by threads in the Catch2 tests.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "device/nccl_api.h"

namespace smddp {

// One rank's side of a simulated communicator's data exchange (what NCCL
// does over NVLink). Called from kernels, in the communicator's issue
// order.
class SimNcclPeers {
 public:
  virtual ~SimNcclPeers() = default;
  // Block until every rank has issued the same collective, then carry it
  // out (NcclApi's meaning). Throw when it cannot complete: a peer died,
  // the ranks disagree, abort() came. The kernel then hangs until the
  // communicator is aborted, as NCCL's does.
  virtual void reduceScatter(const void* send, void* recv, size_t count, DataType dtype,
                             ReduceOp op) = 0;
  virtual void allGather(const void* send, void* recv, size_t count, DataType dtype) = 0;
  // Makes a collective in flight, and every later one, throw at once. Any
  // thread; idempotent.
  virtual void abort() = 0;
};

// Forms rank `rank`'s exchange of the communicator named `id` (NcclApi::
// uniqueId on its rank 0): blocks until every rank has come, bounded by
// the caller's own timeout; throws if it cannot.
using SimNcclConnect =
    std::function<std::shared_ptr<SimNcclPeers>(const std::string& id, int rank, int nranks)>;

struct SimNcclOptions {
  // Percent of init and collective calls that answer kInProgress. Such an
  // init completes, and such a collective's kernel is queued, a random
  // delay in [minDeferral, maxDeferral] later, from another thread.
  int inProgressPercent = 50;
  std::chrono::microseconds minDeferral{0};
  std::chrono::microseconds maxDeferral{2000};
  uint64_t seed = 1;
  // Test hook: the collective with this index (0-based, per communicator)
  // sets kSystemError as the communicator's asynchronous error and hangs,
  // as a kernel does when NCCL's proxy reports a failure; -1 for none.
  int64_t failCollective = -1;
  // Test hook: asked at each init; true makes that init fail with
  // kSystemError, as NCCL's does when its bootstrap fails. Null for never.
  std::function<bool()> failInit;
  // NCCL frees a communicator in ncclCommAbort, so any later use of it is
  // a broken rule; but a call on its way in while another thread aborts
  // (shutdown stopping a launch, as ProcessGroupNCCL's watchdog does) is
  // only refused (kInvalidUsage) for this long after the abort.
  std::chrono::milliseconds abortGrace{1000};
};

std::shared_ptr<NcclApi> makeSimNccl(SimNcclOptions opts, SimNcclConnect connect);

}  // namespace smddp
