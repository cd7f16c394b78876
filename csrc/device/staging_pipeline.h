// The staging pipeline of the GPU path. A call on device memory is cut into
// chunks. Each chunk is copied to page-locked host memory on the copy-in
// stream, its host work (the CPU collective on the staged bytes) runs on
// the pipeline's thread once it has landed, and only then does that thread
// queue its copies back on the copy-out stream. So copies in, host work and
// copies out of different chunks overlap, and no device queue ever waits
// for the host: a copy out is queued when its data is final, never before
// (Gloo's CUDA model; docs/design.md, "GPU path").
//
// The caller gets done(null, event) on the pipeline thread once the host
// work of every chunk is done and their copies back are queued; `event`
// completes after the last of them. On failure it gets done(cause, null),
// and no copy back of the failed chunk or any later one is ever queued, so
// an output never receives staging memory that was not its own result.
//
// Order: host work runs in submit order on one thread, so every rank issues
// its host collectives in the same order.
//
// Staging slots: a slotted chunk's host memory is one of `slots`
// page-locked slots of `slotBytes`, allocated once. The copy in of the
// chunk that reuses a slot waits (on the device) for the copies out of the
// slot's previous chunk; copies in run at most `slots` chunks ahead.
//
// Failure: when host work throws, a chunk's copies in do not land within
// the timeout, or the watch (StagingOptions::watch) throws while they are
// awaited, the pipeline is broken: onBroken runs, and the call and every
// later one fail with the first cause, without touching the device. Memory that copies
// already queued still use (slots, the calls' buffers) is handed to the
// device's reaper (reaper.h), never freed under a running copy.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "device/device.h"

namespace smddp {

struct StageCopy {
  void* device = nullptr;
  // A host address, or, in a chunk with `slotted` set, an offset into the
  // chunk's staging slot (reinterpret_cast<void*>(offset)).
  void* host = nullptr;
  size_t bytes = 0;
};

struct StagingChunk {
  bool slotted = false;        // host memory comes from a staging slot
  std::vector<StageCopy> in;   // device -> host, before the host work
  std::vector<StageCopy> out;  // host -> device, after the host work
  // Runs on the pipeline thread once `in` has landed; gets the slot's base
  // address (nullptr when not slotted). Throws to fail the call.
  std::function<void(void* slot)> host;
  // Device work of the chunk's own, queued by the pipeline thread before
  // `in` on the copy-in stream (an intra-host reduce-scatter and the copy
  // of its shard into the slot), and after `out` on the copy-out stream
  // (the shard's copy back and the all-gather). They get the slot's index
  // and base address (-1 and null when not slotted); beforeIn also gets
  // the call's readiness event (null when none), so that work on a stream
  // of its own can wait for the inputs alone, never for whatever else the
  // shared copy-in stream holds. Null for none.
  std::function<void(DeviceStream&, int slot, void* slotBase, const DeviceEventPtr& ready)> beforeIn;
  std::function<void(DeviceStream&, int slot, void* slotBase)> afterOut;
};

struct StagingCall {
  std::string what;  // "allreduce of 64 MiB", for error messages
  // The call's inputs are ready when this completes (an event the caller
  // recorded on its current stream at submit); null when they already are.
  DeviceEventPtr ready;
  std::vector<StagingChunk> chunks;
  // Called once on the pipeline thread (see above). Also called, with an
  // Error of kind kAborted and no event, for calls still queued at shutdown.
  std::function<void(std::exception_ptr error, DeviceEventPtr done)> done;
  // What the call's copies use (host buffers, tensors): released through
  // the device's reaper once they have completed.
  std::shared_ptr<void> keep;
};

struct StagingOptions {
  int slots = 4;
  size_t slotBytes = 4 << 20;
  std::chrono::milliseconds timeout{30 * 60 * 1000};  // per chunk's copies in
  int inStream = 0;   // the device's pool streams (Device::poolStream) for
  int outStream = 1;  // copies in and copies out
  // Called on the pipeline thread every few milliseconds while it waits for
  // a chunk's copies in, with the call's `what`; throws to fail the call.
  // Copies behind device work that waits for a dead peer (an intra-host
  // NCCL collective) never land: the torch side watches the peers here.
  std::function<void(const std::string& what)> watch;
  // Called once on the pipeline thread when it breaks (a call failed),
  // before it drains: device work that can never complete (that same
  // collective) must be ended first (ncclCommAbort), or the drain, and
  // every stream it shares hardware queues with, would wait for it.
  std::function<void(std::exception_ptr cause)> onBroken;
};

class StagingPipeline {
 public:
  // Allocates the slots: the calling thread must be bound to the device.
  StagingPipeline(std::shared_ptr<Device> device, StagingOptions opts);
  // shutdown().
  ~StagingPipeline();
  StagingPipeline(const StagingPipeline&) = delete;
  StagingPipeline& operator=(const StagingPipeline&) = delete;

  // Queues `call` for the pipeline thread and returns at once; it touches
  // no device. A slotted chunk's copies must fit in slotBytes
  // (kInvalidArgument, before anything is queued).
  void submit(StagingCall call);

  // Stops the thread within about 100 ms: queued calls get done(kAborted).
  // Host work already running is waited for up to 500 ms, then the thread
  // is left behind (detached). Idempotent.
  void shutdown();

  // The first failure, or null.
  std::exception_ptr broken() const;
  size_t slotBytes() const { return opts_.slotBytes; }
  int slots() const { return opts_.slots; }
  Device& device() { return *device_; }
  // The streams a call's device memory is used on (for recordStream).
  DeviceStream& inStream() { return device_->poolStream(opts_.inStream); }
  DeviceStream& outStream() { return device_->poolStream(opts_.outStream); }

 private:
  // What the pipeline thread uses, shared with it: a thread that shutdown()
  // leaves behind (host work that does not return) never outlives it.
  struct Core;
  class Runner;
  static void run(std::shared_ptr<Core> core);

  std::shared_ptr<Device> device_;
  StagingOptions opts_;
  std::shared_ptr<Core> core_;
  std::thread thread_;
};

}  // namespace smddp
