#include "engine/stall_watch.h"

#include "common/error.h"
#include "engine/call.h"
#include "engine/engine_context.h"

namespace smddp {

StallWatch::StallWatch(EngineContext& ctx, const CollectiveSignature& sig, uint64_t seq,
                       std::chrono::milliseconds timeout)
    : ctx_(ctx), sig_(sig), seq_(seq), timeout_(timeout),
      start_(std::chrono::steady_clock::now()), deadline_(start_ + timeout),
      nextLiveness_(start_ + std::chrono::milliseconds(200)) {}

const std::string& StallWatch::what() const {
  if (what_.empty()) what_ = callAt(ctx_.name(), sig_.describe(), seq_);
  return what_;
}

void StallWatch::check(uint64_t firstSeq, const CollectiveSignature* sigs, size_t count,
                       const std::function<std::string()>& waitingOn,
                       const std::function<std::string()>& notSeen) {
  std::string remote;
  for (size_t i = 0; i < count; ++i) {
    ErrorKind kind;
    if (ctx_.control().remoteErrorFor(firstSeq + i, &remote, &kind)) {
      throwError(kind, "smddp: " + what() + " failed on another rank: " + remote);
    }
    if (ctx_.control().probeMismatch(firstSeq + i, sigs[i], &remote)) {
      throwError(ErrorKind::kMismatch, "smddp: " + what() + ": " + remote);
    }
  }
  // A peer timed out or lost a rank: this call cannot complete either.
  if (ctx_.control().brokenByPeer(&remote)) {
    throwError(ErrorKind::kAborted, "smddp: " + what() + " failed on another rank: " + remote);
  }
  // A peer that left the group (shut it down, or said goodbye at exit)
  // before the last of these calls will never run it: fail now, naming
  // it, as Gloo's closed connection does, not at the timeout.
  if (ctx_.control().leftBefore(firstSeq + count - 1, &remote)) {
    throwError(ErrorKind::kPeerLost, "smddp: " + what() + ": " + remote);
  }
  const auto now = std::chrono::steady_clock::now();
  // Liveness before the probe: a probe to a peer that cannot take it may
  // wait for its endpoint, and a dead peer is the better answer anyway.
  // A peer on another host is known dead the moment its liveness
  // connection closes (one atomic flag: read on every pass, so a survivor
  // fails at once, as torchft's recovery wants); the owner locks of peers
  // on this host cost a syscall each, so those every 200 ms.
  PeerFailure lostPeer;
  const PeerMonitor* monitor = ctx_.peers().monitor();
  if (now > nextLiveness_ || (monitor && monitor->failed(&lostPeer))) {
    nextLiveness_ = now + std::chrono::milliseconds(200);
    // A peer on this host that finished these calls, said so and exited
    // (the end of a job, ranks finishing in any order) fails nothing.
    const uint64_t last = firstSeq + count - 1;
    ctx_.peers().checkAlive(what(), [&](int p) { return ctx_.control().leftAfter(p, last); });
  }
  // A call still waiting after 200 ms tells its peers what it is (see
  // ControlPlane::sendProbe): one header per peer, once per call.
  if (!probed_ && (probeNow_ || now - start_ > std::chrono::milliseconds(200))) {
    probed_ = true;
    for (int p = 0; p < ctx_.size(); ++p) ctx_.control().sendProbe(p, firstSeq, sigs[0], false);
  }
  if (now > deadline_) {
    throwError(ErrorKind::kTimeout, "smddp: " + what() + " timed out: timeout of " +
                                        std::to_string(timeout_.count()) +
                                        " ms expired while waiting for " + waitingOn() + "; " +
                                        notSeen());
  }
}

}  // namespace smddp
