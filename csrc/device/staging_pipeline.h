// The staging pipeline of the GPU path. A call on device memory is cut into
// chunks. For each chunk, its device-to-host copies run on a copy stream,
// the host work (the CPU collective on the staged bytes) runs on the
// pipeline's thread as soon as that chunk has landed, and its host-to-device
// copies run on a return stream behind a host flag that the pipeline raises
// when the host work is done. So copies in, host work and copies out of
// different chunks overlap, and the whole device side of a call is queued
// at submit time: the caller gets the completion event at once and never
// blocks on the device.
//
// Order: every chunk gets a ticket (a group-wide counter). Host work runs in
// ticket order, whatever order the copies land in, so every rank issues its
// host collectives in the same order. The return stream waits for
// flag >= ticket before a chunk's copies out.
//
// Staging slots: a chunk can take its host memory from a ring of
// `slots` page-locked slots of `slotBytes` each, allocated once. The copy in
// of the chunk that reuses a slot waits (on the device) for the copies out
// of the slot's previous chunk.
//
// Failure: when host work throws, or a chunk's copies in do not land within
// the timeout, the pipeline is broken. The flag is raised to its maximum so
// every queued device copy drains (outputs then hold partial data), the
// failed call and every later one get done(error) with the first cause, and
// later submits fail the same way. No device stream is ever left waiting on
// the host (a chunk's copies out also wait for its copies in to land).
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
};

struct StagingCall {
  std::string what;  // "allreduce of 64 MiB", for error messages
  // The call's inputs are ready when this completes (an event on the
  // caller's stream); null when they already are.
  DeviceEventPtr ready;
  std::vector<StagingChunk> chunks;
  // Called once on the pipeline thread when the host work of every chunk is
  // done (null) or the call failed (the cause). Also called, with an Error
  // of kind kAborted, for calls still queued at shutdown.
  std::function<void(std::exception_ptr)> done;
};

struct StagingOptions {
  int copyStreams = 1;  // streams for copies in; chunks take them in turn
  int slots = 4;
  size_t slotBytes = 4 << 20;
  std::chrono::milliseconds timeout{30 * 60 * 1000};  // per chunk's copies in
};

class StagingPipeline {
 public:
  StagingPipeline(std::shared_ptr<Device> device, StagingOptions opts);
  // shutdown(), then frees the streams and slots.
  ~StagingPipeline();
  StagingPipeline(const StagingPipeline&) = delete;
  StagingPipeline& operator=(const StagingPipeline&) = delete;

  // Queues the device side of `call` now and its host work on the pipeline
  // thread; returns an event that completes after the call's last copy out.
  // A slotted chunk's copies must fit in slotBytes (kInvalidArgument).
  DeviceEventPtr submit(StagingCall call);

  // Stops the thread within about 100 ms: queued calls get done(kAborted),
  // the flag is raised so device streams drain. Host work already running
  // is waited for up to 500 ms, then the thread is left behind (detached).
  // Idempotent.
  void shutdown();

  // The first failure, or null.
  std::exception_ptr broken() const;
  size_t slotBytes() const { return opts_.slotBytes; }
  int slots() const { return opts_.slots; }
  Device& device() { return *device_; }

 private:
  struct Item;
  // What the pipeline thread uses, shared with it: a thread that shutdown()
  // leaves behind (host work that does not return) never outlives it.
  struct Core;
  static void run(std::shared_ptr<Core> core);
  static std::exception_ptr fail(Core& core, std::exception_ptr cause);

  std::shared_ptr<Device> device_;
  StagingOptions opts_;
  std::shared_ptr<Core> core_;
  // The device side below is queued by submit() under core_->mu.
  std::vector<std::unique_ptr<DeviceStream>> copyIn_;
  std::unique_ptr<DeviceStream> copyOut_;
  std::vector<DeviceEventPtr> slotFree_;  // the last copy out from each slot
  uint64_t nextTicket_ = 1;
  std::thread thread_;
};

}  // namespace smddp
