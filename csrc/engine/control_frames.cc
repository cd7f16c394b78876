// The control plane (control_frames.h; docs/design.md, "Wire format and
// validation"): error frames that tell every peer a call failed here, and
// the stall probes that let a waiting rank learn which call a peer is in.
// Both ride on one tag class, received into a few always-posted receives.
#include "engine/control_frames.h"

#include <rdma/fi_errno.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

#include "common/error.h"
#include "common/logging.h"
#include "engine/allreduce_path.h"  // kMaxFusedCalls

namespace smddp {

namespace {

// Error and probe frames all travel under this one tag (their sequence
// number is in the header), and their receives are posted with an ignore
// mask of 0. Posting receives with ignore bits set breaks tag matching in
// the shm provider of libfabric 1.17: an unexpected message is queued in a
// receive entry recycled without resetting its `ignore` field
// (smr_get_tag), and a later receive is matched against the queued entry
// with that stale mask (smr_match_tagged), so once an error receive had
// completed, data frames could be delivered to receives of another tag.
uint64_t errorTag() { return makeTag(TagClass::kError, 0, 0, 0); }

// Keeps `held` to kMaxHeldControlSequences sequences: the farthest goes
// (a real frame is for this rank's current call, the nearest). Returns how
// many went.
template <class Map>
uint64_t keepNearest(Map& held) {
  uint64_t dropped = 0;
  while (held.size() > kMaxHeldControlSequences) {
    held.erase(std::prev(held.end()));
    ++dropped;
  }
  return dropped;
}

}  // namespace

void ControlPlane::start(Endpoint& endpoint, uint64_t secret,
                         std::shared_ptr<const PeerKeys> keys, iovec sink) {
  endpoint_ = &endpoint;
  secret_ = secret;
  keys_ = std::move(keys);
  sink_ = sink;
  left_.assign(static_cast<size_t>(peers_.size()), Left{});
  heard_.resize(peers_.size());
  for (int i = 0; i < 4; ++i) {
    Request* r = requests_.acquire();
    r->type = Request::Type::kErrorRecv;
    r->text.resize(4096);
    int rc = postReceive(r);
    SMDDP_CHECK(rc == 0, kTransport, "could not post error-frame receives");
  }
}

int ControlPlane::postReceive(Request* r) {
  iovec iov[3] = {{&r->control, sizeof(ControlHead)}, {r->text.data(), r->text.size()}, sink_};
  return endpoint_->postRecv(FI_ADDR_UNSPEC, errorTag(), 0, iov, 3, &r->ctx);
}

void ControlPlane::handleFrame(Request* r, const Completion& c) {
  if (c.err == FI_ECANCELED) {
    requests_.release(r);
    return;
  }
  const FrameHeader& h = r->control.header;
  const bool probe = h.kind == static_cast<uint8_t>(FrameKind::kProbe);
  // (a longer frame spilled into the sink: rejected by the length check)
  std::string why = "its receive failed";
  bool ok = c.err == 0 && checkControlFrame(r->control, r->text.data(), c.len, secret_, *keys_,
                                            r->text.size(), &why) == FrameVerdict::kOk;
  const bool leave = h.kind == static_cast<uint8_t>(FrameKind::kLeave);
  if (ok && !leave && !withinWindow(h.seq)) {
    ok = false;  // far ahead: a forged sequence
    why = "a control frame for a call far ahead of this rank's";
  }
  // The MAC proves who sent the frame and about which call, not when: a
  // copy sent again on the same link must not count twice.
  if (ok && !heard_.take(h, ended_, &why)) ok = false;
  if (!ok) {
    traffic_.refused();
    if (!rejectLogged_) {
      rejectLogged_ = true;  // a forger can send many: one line, the count in stats
      SMDDP_LOG(kWarn) << "smddp: rank " << peers_.rank() << " dropped a control frame (" << why
                       << "); later ones are counted in frames_rejected, not logged";
    }
  } else if (leave) {
    Left& l = left_[h.srcRank];  // srcRank < size: the MAC proved it a rank of the group
    if (h.seq == kNeverLeft) {
      ++greetedBy_;  // a greeting at formation (greetHost)
    } else if (l.seq == kNeverLeft) {
      l = {h.seq, std::chrono::steady_clock::now()};
      anyLeft_ = true;
    }
  } else if (probe) {
    CollectiveSignature theirs = signatureOf(h);
    int src = static_cast<int>(h.srcRank);
    const Called* done = recorded(h.seq);
    if (!done) {
      probes_[h.seq][src] = theirs;  // this rank is in, or not yet at, that call
      traffic_.refused(keepNearest(probes_));
    } else if (!(done->sig == theirs) && h.chunk != 1) {
      sendProbe(src, h.seq, done->sig, /*reply=*/true);  // never answer a reply
    }
  } else {
    std::string text = "rank " + std::to_string(h.srcRank) + " reported: " +
                       std::string(r->text.data(), h.length);
    // chunk == kErrorBroken: the group is unusable there, so it is here:
    // every later call fails at once with that rank's cause.
    const bool broken = h.chunk == kErrorBroken;
    if (broken && brokenReason_.empty()) {
      brokenReason_ = text;
      brokenByPeer_ = true;
    }
    // offset: how many calls from h.seq on the report covers (a batch);
    // a broken group's report may name none.
    if (h.offset > 0 || !broken) {
      auto& slot = remoteErrors_[h.seq];
      if (slot.text.empty()) {
        slot.text = text;
        slot.broken = broken;
        const uint64_t count = std::clamp<uint64_t>(h.offset, 1, kMaxFusedCalls);
        slot.last = h.seq + count - 1;
      }
      traffic_.refused(keepNearest(remoteErrors_));
    }
  }
  // Re-arm the same receive.
  if (postReceive(r) != 0) requests_.release(r);
}

bool ControlPlane::remoteErrorFor(uint64_t seq, std::string* text, ErrorKind* kind) {
  reached_ = std::max(reached_, seq);
  // Reports for sequences this rank already finished are stale: every rank
  // that saw the failure raised it then. Reports for later sequences wait.
  // A report covers the calls of the reporter's failed batch (a fusion
  // batch fails as a whole), so it answers every sequence in that range.
  for (auto it = remoteErrors_.begin(); it != remoteErrors_.end() && it->first <= seq;) {
    if (it->second.last < seq) {
      it = remoteErrors_.erase(it);
      continue;
    }
    *text = it->second.text;
    *kind = it->second.broken ? ErrorKind::kAborted : ErrorKind::kMismatch;
    if (it->second.last == seq) remoteErrors_.erase(it);
    return true;
  }
  return false;
}

void ControlPlane::broadcastError(uint64_t seq, const std::string& text, uint64_t count,
                                  bool broken) {
  std::string body = text.substr(0, 4000);
  for (int p = 0; p < peers_.size(); ++p) {
    // A peer known dead or silent can take nothing: trying would hold this
    // rank's own error back from its caller (postControl retries).
    if (p == peers_.rank() || peers_.lost(p)) continue;
    Request* r = requests_.acquire();
    r->type = Request::Type::kErrorSend;
    r->peer = p;
    r->text = body;
    CollectiveSignature sig;
    seal(r, makeHeader(FrameKind::kError, secret_, seq, peers_.rank(), broken ? kErrorBroken : 0,
                       count, body.size(), sig));
    iovec iov[2] = {{&r->control, sizeof(ControlHead)}, {r->text.data(), r->text.size()}};
    postControl(r, iov, body.empty() ? 1 : 2);
  }
}

void ControlPlane::announceLeave(uint64_t seq, std::chrono::milliseconds budget) {
  sendNotices(seq, budget, [] { return true; });
}

void ControlPlane::greetHost(std::chrono::milliseconds budget) {
  int peersHere = 0;
  for (int p = 0; p < peers_.size(); ++p) peersHere += p != peers_.rank() && peers_.sameHost(p);
  // Until every peer here greeted this rank too: a peer that stopped
  // polling early could leave another's first frame to it waiting.
  if (peersHere > 0) sendNotices(kNeverLeft, budget, [&] { return greetedBy_ >= peersHere; });
}

void ControlPlane::sendNotices(uint64_t seq, std::chrono::milliseconds budget,
                               const std::function<bool()>& alsoDone) {
  if (!endpoint_) return;
  std::vector<Request*> unsent;
  for (int p = 0; p < peers_.size(); ++p) {
    if (p == peers_.rank() || !peers_.sameHost(p) || peers_.lost(p)) continue;
    Request* r = requests_.acquire();
    r->type = Request::Type::kLeaveSend;
    r->peer = p;
    r->text.clear();
    seal(r, makeHeader(FrameKind::kLeave, secret_, seq, peers_.rank(), 0, 0, 0,
                       CollectiveSignature{}));
    unsent.push_back(r);
  }
  // Nothing else polls now: post, and progress until every notice is sent.
  // A first send to a peer this rank never talked to waits for the
  // connection (-FI_EAGAIN); a peer that already closed its endpoint may
  // never take one, so the budget bounds it (its own timeout still does).
  const auto deadline = std::chrono::steady_clock::now() + budget;
  while (true) {
    std::erase_if(unsent, [&](Request* r) {
      iovec iov{&r->control, sizeof(ControlHead)};
      int rc = -1;
      try {
        rc = endpoint_->postSend(peers_.addr(r->peer), errorTag(), &iov, 1, &r->ctx);
      } catch (const Error&) {
      }
      if (rc == -FI_EAGAIN) return false;
      if (rc == 0) {
        ++leavesInFlight_;
      } else {
        requests_.release(r);
      }
      return true;
    });
    if ((unsent.empty() && leavesInFlight_ <= 0 && alsoDone()) ||
        std::chrono::steady_clock::now() > deadline) {
      break;
    }
    if (engine_.progress() == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  for (Request* r : unsent) requests_.release(r);
}

bool ControlPlane::leftBefore(uint64_t seq, std::string* why) const {
  if (anyLeft_) {
    for (size_t p = 0; p < left_.size(); ++p) {
      if (left_[p].seq > seq) continue;
      *why = "rank " + std::to_string(p) + " left the group: it shut its process group down " +
             "before running call " + std::to_string(left_[p].seq) +
             ", so this call cannot complete";
      return true;
    }
  }
  const PeerMonitor* monitor = peers_.monitor();
  int rank = -1;
  std::chrono::steady_clock::time_point when;
  if (monitor && monitor->leftBefore(seq, &rank, &when)) {
    *why = "rank " + std::to_string(rank) + " on host " + hostDisplayName(peers_.info(rank).host) +
           " left the group: it said goodbye (its process exited or shut its process group " +
           "down), so this call, which needs it, cannot complete";
    return true;
  }
  return false;
}

bool ControlPlane::leftAt(int peer, std::chrono::steady_clock::time_point* when) const {
  if (peer < 0 || static_cast<size_t>(peer) >= left_.size()) return false;
  if (left_[peer].seq != kNeverLeft) {
    *when = left_[peer].at;
    return true;
  }
  const PeerMonitor* monitor = peers_.monitor();
  return monitor && monitor->leftAt(peer, when);
}

void ControlPlane::seal(Request* r, const FrameHeader& h) {
  r->control.header = h;
  const PeerMac mac = controlFrameMac(*keys_, h, static_cast<uint32_t>(r->peer),
                                      std::string_view(r->text).substr(0, h.length));
  std::memcpy(r->control.mac, mac.bytes, kPeerMacBytes);
}

void ControlPlane::postControl(Request* r, const iovec* iov, size_t n) {
  // A first send to a peer this rank never talked to waits for the
  // connection (-FI_EAGAIN): progress and retry for a while rather than
  // drop the frame (the peers would then only learn at their timeout).
  // Inside progress() (a probe answered from a completion) there is no
  // retry: progress is not re-entered.
  // Not for a peer on another host: the pending list below retries it just
  // as well, and a lost host's peers would each hold this rank's own error
  // back from its caller by the whole wait.
  const bool remote = !peers_.sameHost(r->peer);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(remote ? 0 : 500);
  while (true) {
    int rc = -1;
    try {
      rc = endpoint_->postSend(peers_.addr(r->peer), errorTag(), iov, n, &r->ctx);
    } catch (const Error&) {
      break;  // a broken endpoint: the caller is already reporting a failure
    }
    if (rc == 0) return;
    // No retries inside progress(), once the endpoint is quarantined, or
    // while shutting down (a stopped peer's full queue must not hold
    // abort): the peer's own timeout still bounds its wait.
    if (engine_.inProgress() || engine_.pollingStopped() ||
        std::chrono::steady_clock::now() > deadline) {
      break;
    }
    engine_.progress();
  }
  // Not sent yet. The usual reason is a peer this rank never exchanged a
  // message with: the shm provider connects on first send and needs the
  // peer to progress, which a peer busy in compute (or asleep) does not.
  // Dropping the frame would leave that peer to find out at its timeout,
  // so the frame waits in pending_, retried on every progress()
  // (the engine keeps polling, every SMDDP_SLEEP_US, while any wait) for
  // ten group timeouts, at least a minute: a late peer is often late by
  // more than one timeout, which is what broke the group. Not while
  // stopping or quarantined: nothing is polled then.
  if (!engine_.pollingStopped()) {
    const auto keep =
        std::max<std::chrono::milliseconds>(10 * engine_.timeout(), std::chrono::minutes(1));
    pending_.push_back({r, std::chrono::steady_clock::now() + keep});
    return;
  }
  requests_.release(r);  // best effort: the peer's timeout still bounds it
}

void ControlPlane::retryPending() {
  const auto now = std::chrono::steady_clock::now();
  std::erase_if(pending_, [&](const Pending& pc) {
    Request* r = pc.request;
    iovec iov[2] = {{&r->control, sizeof(ControlHead)}, {r->text.data(), r->text.size()}};
    int rc = -1;
    try {
      rc = endpoint_->postSend(peers_.addr(r->peer), errorTag(), iov, r->text.empty() ? 1 : 2,
                               &r->ctx);
    } catch (const Error&) {
    }
    if (rc == 0) return true;  // posted: its completion releases it
    if (now < pc.giveUp && rc == -FI_EAGAIN) return false;
    requests_.release(r);
    return true;
  });
}

void ControlPlane::noteSignature(uint64_t seq, const CollectiveSignature& sig) {
  reached_ = std::max(reached_, seq);
  ended_ = std::max(ended_, seq + 1);
  history_[seq % kHistory] = {seq, true, sig};
  auto it = probes_.find(seq);
  if (it != probes_.end()) {
    // Probes that came in while this call ran but that it never looked at:
    // tell those senders what this rank called.
    for (const auto& [src, theirs] : it->second) {
      if (!(theirs == sig)) sendProbe(src, seq, sig, /*reply=*/true);
    }
  }
  probes_.erase(probes_.begin(), probes_.upper_bound(seq));
}

void ControlPlane::sendProbe(int peer, uint64_t seq, const CollectiveSignature& sig, bool reply) {
  if (peer == peers_.rank() || peer < 0 || peer >= peers_.size() || peers_.lost(peer)) return;
  Request* r = requests_.acquire();
  r->type = Request::Type::kErrorSend;
  r->peer = peer;
  seal(r, makeHeader(FrameKind::kProbe, secret_, seq, peers_.rank(), reply ? 1 : 0, 0, 0, sig));
  iovec iov[1] = {{&r->control, sizeof(ControlHead)}};
  postControl(r, iov, 1);  // best effort, like error frames
}

bool ControlPlane::probeMismatch(uint64_t seq, const CollectiveSignature& mine, std::string* why) {
  reached_ = std::max(reached_, seq);
  probes_.erase(probes_.begin(), probes_.lower_bound(seq));
  auto it = probes_.find(seq);
  if (it == probes_.end()) return false;
  for (const auto& [src, theirs] : it->second) {
    if (theirs == mine) continue;
    *why = "rank " + std::to_string(src) + " called " + theirs.describe() + " at sequence " +
           std::to_string(seq) + " but this rank called " + mine.describe() + " at sequence " +
           std::to_string(seq);
    return true;
  }
  return false;
}

std::vector<int> ControlPlane::probedAt(uint64_t seq) const {
  std::vector<int> out;
  auto it = probes_.find(seq);
  if (it != probes_.end()) {
    for (const auto& [src, sig] : it->second) out.push_back(src);
  }
  return out;
}

}  // namespace smddp
