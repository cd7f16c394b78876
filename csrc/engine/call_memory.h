// The running call's memory (EngineContext::memory()): scratch memory
// reused across collectives, the fusion buffer, what a send the call gave
// up on holds, and the overflow sink every receive ends in. Worker thread
// only (or a caller running its own call).
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/request.h"
#include "observe/traffic_observer.h"

namespace smddp {

class CallMemory {
 public:
  // `traffic` counts the sends that hold memory.
  explicit CallMemory(const TrafficObserver& traffic) : traffic_(traffic) {}
  CallMemory(const CallMemory&) = delete;
  CallMemory& operator=(const CallMemory&) = delete;

  // Scratch memory is reused across collectives. A send of the running
  // call that is still posted although the call gave up on it
  // (Exchange::abandonOutstanding) holds the call's memory (its
  // completions, once run, and the scratch buffers) until the send
  // completes (holdForSend).
  uint8_t* scratch(size_t bytes);
  uint8_t* fusionBuffer(size_t bytes);
  void holdForSend(Request* r);
  // Once a call ended: what its still-posted sends hold, now with the
  // scratch buffers (the next call allocates new ones), for the caller to
  // add the call's completions to; null when no send holds anything.
  std::shared_ptr<HeldMemory> detachHeldMemory();

  // Every receive ends in this iov: a peer that sends more than expected
  // (a mismatched call) spills here instead of truncating, so the frame's
  // header can still be read and reported. Virtual memory, never touched
  // by a well-behaved job.
  iovec overflowSink() const { return {sink_.base, kSinkBytes}; }
  static constexpr size_t kSinkBytes = 1ull << 30;
  // The sink's reservation: made while the group forms, unmapped at
  // release (EngineContext::release) or by the destructor.
  void reserveSink() { sink_.reserve(); }
  void releaseSink() { sink_.release(); }

 private:
  const TrafficObserver& traffic_;
  std::vector<uint8_t> scratch_;
  std::vector<uint8_t> fusion_;
  // What the running call's unconfirmed sends hold (holdForSend), until
  // detachHeldMemory.
  std::shared_ptr<HeldMemory> callHeld_;
  // The overflow sink's reservation, unmapped by its destructor too, so a
  // constructor that throws after reserving it leaks nothing.
  struct Sink {
    void* base = nullptr;
    void reserve();
    void release();
    ~Sink() { release(); }
  };
  Sink sink_;
};

}  // namespace smddp
