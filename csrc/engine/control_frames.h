// The error and control plane of one group (docs/design.md, "Failure
// model"): error frames that tell every peer a call failed here, stall
// probes that let a waiting rank learn which call a peer is in, and the
// group's broken state. It rides on the engine context's endpoint,
// request pool and progress loop, which hands it the control completions.
#pragma once

#include <sys/uio.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/control_replay.h"
#include "engine/peer_table.h"
#include "engine/request.h"
#include "observe/traffic_observer.h"
#include "transport/endpoint.h"
#include "transport/frame.h"

namespace smddp {

// All state is worker thread only (or a caller running its own call:
// Communicator::runOnCaller), like the endpoint it posts on.
class ControlPlane {
 public:
  // What the control plane needs of the engine loop it rides on. The
  // engine context implements it with a small adapter, so none of its own
  // calls become virtual; these are called only while a control frame
  // waits for its peer.
  class Engine {
   public:
    // Reads completions and dispatches them (EngineContext::progress).
    virtual size_t progress() = 0;
    // Inside progress(), which is never re-entered.
    virtual bool inProgress() const = 0;
    // Nothing polls the endpoint any more: quarantined, or shutting down.
    virtual bool pollingStopped() const = 0;
    // The group timeout (WaitLimits::timeout).
    virtual std::chrono::milliseconds timeout() const = 0;

   protected:
    ~Engine() = default;
  };

  ControlPlane(Engine& engine, const PeerTable& peers, RequestPool& requests,
               const TrafficObserver& traffic)
      : engine_(engine), peers_(peers), requests_(requests), traffic_(traffic) {}
  ControlPlane(const ControlPlane&) = delete;
  ControlPlane& operator=(const ControlPlane&) = delete;

  // Once the endpoint and the peers' addresses exist: posts the receives
  // that stay armed for control frames. `secret` keeps other groups'
  // frames apart, `keys` (shared with the liveness monitor) MAC every
  // frame. `sink` ends each receive (see CallMemory::overflowSink).
  void start(Endpoint& endpoint, uint64_t secret, std::shared_ptr<const PeerKeys> keys,
             iovec sink);
  // Shutdown, before the request pool is cleared: forgets the frames that
  // still wait for their peer (their requests go with the pool).
  void close() { pending_.clear(); }

  // --- Error frames ---
  // The first error another rank reported for a sequence <= seq, if any,
  // and the kind this rank raises it as: kAborted when the report said the
  // group is unusable there (a timeout, a lost peer), so that the group's
  // asynchronous error and the ranks it lost are read as such here too;
  // kMismatch otherwise (the reporter's call alone failed).
  bool remoteErrorFor(uint64_t seq, std::string* text, ErrorKind* kind);
  // Tells every peer that calls seq .. seq + count - 1 failed here, so
  // nobody waits for us. `broken`: the group is unusable here (timeout,
  // lost peer), and so, from their next call, everywhere; count 0 then
  // names no call.
  void broadcastError(uint64_t seq, const std::string& text, uint64_t count = 1,
                      bool broken = false);

  // --- The group's broken state ---
  // Set when the group became unusable (a timeout, a lost peer, a
  // quarantined endpoint, here or reported by a peer): every later call
  // fails at once with the reason.
  bool broken() const { return !brokenReason_.empty(); }
  const std::string& brokenReason() const { return brokenReason_; }
  // Records `why` unless the group is already broken.
  void markBroken(const std::string& why) {
    if (brokenReason_.empty()) brokenReason_ = why;
  }
  // Set when a peer reported that the group is unusable (a timeout or a
  // lost peer there): the reason, and the current call fails with it.
  bool brokenByPeer(std::string* why) const {
    if (!brokenByPeer_) return false;
    *why = brokenReason_;
    return true;
  }

  // --- Stall probes ---
  // Ranks that disagree on a call may all sit in receives that no peer
  // will ever send to (e.g. an allreduce server and a broadcast receiver),
  // so no data frame can reveal the mismatch. An Exchange stalled for a
  // moment sends its signature to every peer; a peer in that call compares
  // it there (probeMismatch), a peer already past it answers with what it
  // called instead (noteSignature keeps a short history), so the stalled
  // rank fails with a mismatch, not a timeout.
  void sendProbe(int peer, uint64_t seq, const CollectiveSignature& sig, bool reply);
  // A probe from a peer whose call at `seq` differs from `mine`.
  bool probeMismatch(uint64_t seq, const CollectiveSignature& mine, std::string* why);
  // Ranks whose stall probe for `seq` arrived here (they reached that call).
  std::vector<int> probedAt(uint64_t seq) const;
  // Records what this rank called at `seq` (an Exchange does, when it ends).
  void noteSignature(uint64_t seq, const CollectiveSignature& sig);
  // What this rank called at `seq`, if it is still in the recent history.
  bool calledAt(uint64_t seq, CollectiveSignature* sig) const {
    const Called* c = recorded(seq);
    if (!c) return false;
    *sig = c->sig;
    return true;
  }

  // --- Leaving (docs/design.md, "A peer that leaves") ---
  // Shutdown, once nothing else polls: tells the peers on this host that
  // this rank runs no call from `seq` on (its first unfinished one), and
  // progresses until each notice is sent or `budget` has passed. Peers on
  // other hosts hear the same from its liveness goodbye.
  void announceLeave(uint64_t seq, std::chrono::milliseconds budget);
  // Formation, after start(): one frame each way between this rank and
  // every peer on its host (a leave notice for no call), until each peer
  // greeted this rank or `budget` passed. A first frame to a peer waits
  // for a connection the peer's own polling completes (shm, rxm), and a
  // rank that leaves must reach a peer that sits idle: connected now, its
  // notices go straight through.
  void greetHost(std::chrono::milliseconds budget);
  // A rank that left before call `seq` (it never ran it): that call cannot
  // complete. Names the rank and how it left in *why. Any thread that polls.
  bool leftBefore(uint64_t seq, std::string* why) const;
  // When `peer` left (either way), if it did: its point-to-point operations
  // still waiting then cannot complete.
  bool leftAt(int peer, std::chrono::steady_clock::time_point* when) const;
  // Whether `peer` said, leaving, that it ran every call up to `seq`: its
  // process may then exit while this rank still finishes that call.
  bool leftAfter(int peer, uint64_t seq) const {
    return peer >= 0 && static_cast<size_t>(peer) < left_.size() &&
           left_[static_cast<size_t>(peer)].seq != kNeverLeft &&
           left_[static_cast<size_t>(peer)].seq > seq;
  }

  // --- Called by EngineContext::progress ---
  // A completion of one of the control receives (Request::Type::kErrorRecv).
  void handleFrame(Request* r, const Completion& c);
  // Control frames wait for their peer (the engine keeps polling meanwhile).
  bool hasPending() const { return !pending_.empty(); }
  void retryPending();
  // A leave notice's send completed (or failed): announceLeave stops waiting for it.
  void leaveSent() { --leavesInFlight_; }

 private:
  // Sends a leave notice for `seq` to every peer on this host and polls
  // until each is sent and alsoDone(), or `budget` passed.
  void sendNotices(uint64_t seq, std::chrono::milliseconds budget,
                   const std::function<bool()>& alsoDone);
  // Sets r->control to `h` and its MAC for r->peer, over r->text.
  void seal(Request* r, const FrameHeader& h);
  // Posts an error or probe frame to r->peer, retrying a busy endpoint.
  void postControl(Request* r, const iovec* iov, size_t n);
  // (Re-)arms one control receive; the endpoint's return code.
  int postReceive(Request* r);

  Engine& engine_;
  const PeerTable& peers_;
  RequestPool& requests_;
  const TrafficObserver& traffic_;
  Endpoint* endpoint_ = nullptr;  // set by start()
  uint64_t secret_ = 0;
  std::shared_ptr<const PeerKeys> keys_;  // set by start(), immutable after
  bool rejectLogged_ = false;             // the first rejected frame is logged
  iovec sink_{};

  struct RemoteError {
    uint64_t last = 0;  // the report covers sequences first .. last
    std::string text;
    bool broken = false;  // the reporter's group is unusable
  };
  // Both bounded (kControlSequenceWindow, kMaxHeldControlSequences).
  std::map<uint64_t, RemoteError> remoteErrors_;
  std::map<uint64_t, std::map<int, CollectiveSignature>> probes_;
  // Two watermarks, never one: a call counts as reached from its first
  // look-up but as ended only once it ends, and a fused batch looks up all
  // its calls at once, so ended_ <= reached_ + 1, equal when nothing runs.
  // The latest call this rank has looked up (remoteErrorFor, probeMismatch)
  // or ended: frames may name calls up to a window past it (withinWindow).
  // ended_ in its place would shrink the window during a batch.
  uint64_t reached_ = 0;
  // Every call before this one has ended here (noteSignature): the replay
  // guard refuses error reports about those calls only. reached_ in its
  // place would refuse reports about the calls still running.
  uint64_t ended_ = 0;
  ControlReplayGuard heard_;  // sized by start()
  // Whether a frame for `seq` may be kept (within the window).
  bool withinWindow(uint64_t seq) const { return seq <= reached_ + kControlSequenceWindow; }
  // The last kHistory calls, by sequence modulo kHistory: a ring, since
  // every call writes it (a map allocated a node per call).
  struct Called {
    uint64_t seq = 0;
    bool valid = false;
    CollectiveSignature sig{};
  };
  static constexpr uint64_t kHistory = 64;
  std::array<Called, kHistory> history_{};
  const Called* recorded(uint64_t seq) const {
    const Called& c = history_[seq % kHistory];
    return c.valid && c.seq == seq ? &c : nullptr;
  }
  std::string brokenReason_;
  bool brokenByPeer_ = false;  // brokenReason_ came from a peer
  // Ranks on this host that left, by rank: the first call each never ran
  // (kNeverLeft if it did not leave), and when its notice came. One slot
  // per rank, so a notice needs no window: a forger has no MAC anyway.
  static constexpr uint64_t kNeverLeft = UINT64_MAX;
  struct Left {
    uint64_t seq = kNeverLeft;
    std::chrono::steady_clock::time_point at{};
  };
  std::vector<Left> left_;  // sized by start()
  bool anyLeft_ = false;     // some entry of left_ is set (leftBefore's fast path)
  int leavesInFlight_ = 0;  // announceLeave's notices not yet completed
  int greetedBy_ = 0;       // greetings from peers on this host (greetHost)
  // Control frames whose peer could not take them yet (postControl),
  // retried by progress() until they post or their deadline passes.
  struct Pending {
    Request* request;
    std::chrono::steady_clock::time_point giveUp;
  };
  std::vector<Pending> pending_;
};

}  // namespace smddp
