// The flight recorder: a ring of a group's last SMDDP_TRACE_BUFFER_SIZE
// collectives with their state and timestamps, written as calls are queued,
// run and completed. It answers "where is this rank?" (position(), the
// desync report's input) and is dumped as JSON when a call fails.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "transport/frame.h"

namespace smddp {

// Ring size from SMDDP_TRACE_BUFFER_SIZE (0: no recorder); SMDDP_DEBUG_DIR
// (empty: no dumps).
int64_t traceBufferSize();
std::string debugDir();

enum class CallState : uint8_t { kQueued, kStarted, kCompleted, kFailed };
const char* toString(CallState s);

// How a call ran (set when it starts).
enum class CallPath : uint8_t {
  kUnknown,
  kSharedMemory,  // through the host segment (one host): a fusion batch, or an
                  // all-gather or reduce-scatter reading its peers directly
  kHierarchy,     // through the segments, then across hosts: a fusion batch, or
                  // an all-gather or reduce-scatter
  kNetwork,       // libfabric only
};
const char* toString(CallPath p);

struct FlightEntry {
  uint64_t seq = 0;
  bool hasSignature = false;  // barriers have none
  CollectiveSignature sig;
  CallState state = CallState::kQueued;
  CallPath path = CallPath::kUnknown;
  uint64_t batch = 0;       // first sequence of the fusion batch it ran in
  uint32_t batchCalls = 0;  // calls in that batch (0: not run yet)
  bool onCaller = false;    // ran on the caller's thread
  // Nanoseconds of the steady clock; 0 = not reached.
  int64_t queuedNs = 0, startedNs = 0, endedNs = 0;
  std::string error;  // first line of the failure, if it failed

  // "allreduce(SUM, float32, 100 elements)", or "barrier".
  std::string describe() const;
  uint64_t bytes() const;
};

// Where a rank stands in a group, for the desync report. It is the oldest
// call that has not finished, or, when every call has, the last one.
struct RankPosition {
  enum class Kind : uint8_t { kKnown, kUnreachable, kLost, kNoRecorder };
  int rank = -1;
  Kind kind = Kind::kUnreachable;
  bool idle = false;    // every call it issued has finished
  bool any = false;     // it has issued a call at all
  uint64_t seq = 0;     // the call (or, idle, the last one)
  std::string call;     // "allreduce(SUM, float32, 100 elements)"
  uint64_t bytes = 0;
  std::string state;    // "issued, not started", "running for 2.1 s", "failed", ...

  std::string serialize() const;
  static RankPosition parse(int rank, const std::string& text);
};

// "rank 3 is at sequence 41 (allreduce, 2.1 MB, issued, not started);
// ranks 0-2 wait at sequence 42 (broadcast, 4 B, running for 30.0 s)".
// The same text online (the error message) and offline (trace analyze).
std::string formatDesyncReport(std::vector<RankPosition> positions);
// "1.5 MB", "4 B".
std::string humanBytes(uint64_t bytes);

class FlightRecorder {
 public:
  FlightRecorder(std::string group, int rank, int size, size_t capacity);

  // Hot path: each takes the lock once and touches one slot (seq % capacity).
  // `at` is a time the caller has read anyway (a clock read costs about as
  // much as the rest of the hook).
  using TimePoint = std::chrono::steady_clock::time_point;
  void queued(uint64_t seq, const CollectiveSignature* sig, TimePoint at);
  void started(uint64_t seq, CallPath path, uint64_t batch, bool onCaller, TimePoint at);
  // `batchCalls`: how many calls ran together (a fusion batch), 1 if alone.
  void ended(uint64_t seq, const std::string* error, uint32_t batchCalls, TimePoint at);

  std::vector<FlightEntry> entries() const;  // oldest first
  RankPosition position() const;
  // The position this rank reported for a desync report (serialized): a
  // dump carries it rather than the position at dump time, so the offline
  // report is the one the error carried.
  void notePosition(const std::string& serialized);
  // {"group":..., "rank":..., "size":..., "position":..., "entries":[...]}
  // with wall-clock microseconds.
  std::string toJson() const;

  const std::string& group() const { return group_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

  // How torch names this group in its flight recorder dumps (torch_fr.h):
  // its description ("default_pg") and its global ranks ("[0, 1, 2]"). Set
  // by the backend once it knows them; metadata, so const.
  void setTorchGroup(std::string desc, std::vector<int> globalRanks) const;
  std::string torchDesc() const;
  std::string torchRanks() const;

 private:
  FlightEntry* slot(uint64_t seq);  // null if `seq` has left the ring; mu_ held
  RankPosition positionLocked() const;

  const std::string group_;
  const int rank_;
  const int size_;
  mutable std::mutex mu_;
  std::vector<FlightEntry> ring_;  // guarded by mu_; entry for seq s at s % size
  uint64_t next_ = 0;              // guarded by mu_: one past the newest queued sequence
  std::string reported_;           // guarded by mu_: notePosition
  mutable std::string torchDesc_ = "undefined";  // guarded by mu_
  mutable std::vector<int> globalRanks_;         // guarded by mu_: empty = 0..size-1
};

// Writes `json` to SMDDP_DEBUG_DIR/smddp_trace_rank<R>_g<group>.json, where
// R is the process's global rank (RANK, else its rank in the group) and
// <group> the group's name with every character but letters and digits as
// '_'; returns the path, or "" when SMDDP_DEBUG_DIR is unset or the write
// failed. With TORCH_FR_DUMP_TEMP_FILE set it also writes torch's dump of
// every live group (torch_fr.h).
std::string dumpFlightRecord(const FlightRecorder& rec, const std::string& reason);

}  // namespace smddp
