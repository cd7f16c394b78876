// The messages of one collective call. An algorithm declares the receives
// and sends it needs (receives first, so peers' data lands in place); run()
// posts them, progresses the endpoint, validates each arriving frame and
// fires its callback, and returns when everything completed. Every wait is
// bounded by the group timeout; a failure cancels what is still posted.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/engine_context.h"
#include "engine/stall_watch.h"

namespace smddp {

class Exchange {
 public:
  // Whether the call ends with this exchange (the usual case), or goes on
  // after it and notes its own end (ControlPlane::noteSignature): an error
  // report about a call that has ended here is refused as a replay.
  enum class CallEnd { kWithExchange, kLater };
  // `timeout` 0 means the group's timeout.
  Exchange(EngineContext& ctx, uint64_t seq, const CollectiveSignature& sig,
           std::chrono::milliseconds timeout = std::chrono::milliseconds(0),
           CallEnd end = CallEnd::kWithExchange);
  ~Exchange();
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;

  // Receive `bytes` from `peer` into `dst`; `onArrive` runs once the frame
  // is validated (it may call send()). `urgent` receives jump the queue of
  // not-yet-posted receives: a server re-arming its ring must never wait
  // behind result receives, or two servers can wait on each other.
  void recv(int peer, uint32_t phase, uint32_t chunk, void* dst, size_t bytes,
            std::function<void()> onArrive = nullptr, bool urgent = false);
  // `onSent` runs once the send completed (the provider no longer reads
  // `src`).
  void send(int peer, uint32_t phase, uint32_t chunk, uint64_t offset, const void* src,
            size_t bytes, std::function<void()> onSent = nullptr);

  // Progress until all messages completed. Throws smddp::Error.
  void run();
  // One step of run() that never waits: posts what it can, reads the
  // completions there are (running their callbacks) and returns how many.
  // Throws smddp::Error as run() does, but leaves the deadline, stall
  // probes and liveness to the caller (which polls other work between
  // calls and checks them itself). More messages may be added between
  // polls.
  size_t poll();
  bool finished() const { return pending_ == 0; }
  // The ranks whose messages this call still waits for.
  std::string waitingOn() const;

  // Called by EngineContext::progress for this exchange's completions.
  void complete(Request* r, const Completion& c);

  uint64_t seq() const { return seq_; }
  const CollectiveSignature& signature() const { return sig_; }

 private:
  void postPending();
  bool postOne(Request* r);
  [[noreturn]] void fail(ErrorKind kind, const std::string& msg);
  // After a failed completion: looks briefly for the peer's own account
  // of a lost peer, then throws.
  [[noreturn]] void raiseFailure();
  void runCallback(Request* r);
  // Cancels what is posted and waits (bounded) until no receive of this
  // call can write its memory any more, and (shorter) for its sends.
  void abandonOutstanding();
  void awaitAbandoned();
  std::string notSeen() const;

  EngineContext& ctx_;
  uint64_t seq_;
  CollectiveSignature sig_;
  std::chrono::milliseconds timeout_;
  CallEnd end_;
  StallWatch watch_;  // remote errors, probes, deadline, liveness
  std::deque<Request*> recvsToPost_;   // created, not yet accepted by the provider
  std::deque<Request*> sendsToPost_;
  size_t postedRecvs_ = 0;             // receives posted, completion not yet seen
  std::vector<Request*> outstanding_;  // posted, completion not yet seen
  size_t pending_ = 0;                 // toPost_ + posted-but-incomplete
  std::vector<bool> heardFrom_;        // a valid frame of this call came from rank i
  bool failed_ = false;
  bool abandoning_ = false;  // completions now only settle cancelled requests
  int cancelRefused_ = 0;    // an fi_cancel code other than 0 / -FI_ENOENT
  size_t abandonedSends_ = 0;  // sends still posted when the call gave up
  ErrorKind errorKind_ = ErrorKind::kInternal;
  std::string error_;
};

// The longest an exchange sleeps between polls while no caller waits on
// any call (a caller that starts to wait meets at most this much).
inline constexpr std::chrono::microseconds kIdleSleepCap{1000};

// Phases of a tag: which step of an algorithm a message belongs to.
constexpr uint32_t kPhaseToServer = 0;
constexpr uint32_t kPhaseFromServer = 1;
// Between hosts, after each host reduced through its shared segment.
constexpr uint32_t kPhaseHostsToServer = 2;
constexpr uint32_t kPhaseHostsReturn = 3;
// Rank 0's cut of a fusion batch, to the other hosts' leaders.
constexpr uint32_t kPhasePlan = 4;
// Network-only path: each rank's proposal for a fusion batch's cut, riding
// in the exchange of the batch's first call (network_fusion.h).
constexpr uint32_t kPhaseCut = 5;

}  // namespace smddp
