// SMDDP_TIMELINE: a Chrome / Perfetto trace-event file per rank that shows
// every collective (queued to completed), each fusion batch and the calls
// it took, the shared-memory steps of a batch (copies in, a server's
// combines, copies out) and the plan wait before it (docs/design.md,
// "Timeline"). Torch-free: the engine records, the backend only configures
// and flushes.
//
// Disabled (the default), every hook is one predictable branch on a global
// flag and allocates nothing. Enabled, events are small fixed-size records
// appended under one lock to a buffer of bounded size; the buffer is written
// out when it fills, at most a second after the last write, when a group
// shuts down, and at process exit. The file is rewritten in place so it is
// a complete JSON array after every write.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include "transport/frame.h"

namespace smddp::timeline {

extern std::atomic<bool> gOn;

// One predictable branch: whether SMDDP_TIMELINE is recording.
inline bool on() { return __builtin_expect(gOn.load(std::memory_order_relaxed), false); }

// Reads SMDDP_TIMELINE once per process (the first call decides; later
// calls do nothing) and, when it is set, opens this rank's file.
void configure(int rank);

// The file SMDDP_TIMELINE=pattern names for `rank`: "{rank}" replaced by
// the rank, else ".rank<R>" inserted before a ".json" suffix (appended
// when there is none). "t.json" -> "t.rank0.json".
std::string pathFor(const std::string& pattern, int rank);
// Where this process writes ("" when not recording).
std::string path();

// Microseconds on a clock every rank of a host shares (steady_clock,
// offset once to CLOCK_REALTIME), as the trace's timestamps.
int64_t toNs(std::chrono::steady_clock::time_point t);
inline int64_t nowNs() { return toNs(std::chrono::steady_clock::now()); }

// Names the calling thread's track ("engine <group>"); unnamed threads that
// record are "caller" tracks.
void nameThread(const std::string& name);

// A collective was issued (the caller's thread, an instant on its track).
void issued(const std::string& group, uint64_t seq, const CollectiveSignature& sig);
// A collective's life, queued to completed: an async span with its
// sequence number, collective, dtype, op, bytes and path.
void call(const std::string& group, uint64_t seq, const CollectiveSignature& sig,
          const char* path, int64_t queuedNs, int64_t endNs, bool ok);
// A call that ran outside a fusion batch, on the running thread's track.
void ran(const std::string& group, uint64_t seq, const CollectiveSignature& sig, int64_t beginNs,
         int64_t endNs);
// A fusion batch, on the running thread's track: the calls firstSeq ..
// firstSeq + calls - 1 (a batch takes consecutive calls).
void batch(const std::string& group, uint64_t index, uint64_t firstSeq, uint32_t calls,
           uint64_t bytes, bool small, int64_t beginNs, int64_t endNs);
// One phase of a batch's shared-memory steps [firstStep, endStep).
enum class Phase : uint8_t { kCut, kCopyIn, kCombine, kCopyOut };
void phase(Phase p, const std::string& group, uint64_t batchIndex, uint64_t firstStep,
           uint64_t endStep, uint64_t bytes, int64_t beginNs, int64_t endNs);

// Writes what is buffered; the file stays valid JSON. Any thread.
void flush();

}  // namespace smddp::timeline
