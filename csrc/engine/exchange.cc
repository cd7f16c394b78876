#include "engine/exchange.h"

#include <rdma/fi_errno.h>

#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "common/caller_waiting.h"
#include "common/error.h"
#include "common/param.h"
#include "engine/sealed_frames.h"

namespace smddp {

SMDDP_PARAM_BYTES(paramChunkBytes, "SMDDP_CHUNK_BYTES", 262144, 4096, 1LL << 30,
                  "largest message on the wire; bigger shards are pipelined in chunks of this size")
SMDDP_PARAM_INT(paramMaxPostedRecvs, "SMDDP_MAX_POSTED_RECVS", 256, 8, 100000,
                "receives one collective keeps posted at once (shm holds about 1024 in all)")

void readExchangeParams(EngineConfig& c) {
  c.chunkBytes = static_cast<uint64_t>(paramChunkBytes());
  c.maxPostedRecvs = paramMaxPostedRecvs();
}


Exchange::Exchange(EngineContext& ctx, uint64_t seq, const CollectiveSignature& sig,
                   std::chrono::milliseconds timeout, CallEnd end)
    : ctx_(ctx), seq_(seq), sig_(sig),
      timeout_(timeout.count() > 0 ? timeout : ctx.waits().timeout()),
      end_(end),
      watch_(ctx, sig, seq, timeout_),
      heardFrom_(static_cast<size_t>(ctx.size()), false) {}

Exchange::~Exchange() {
  abandonOutstanding();
  if (end_ == CallEnd::kLater) return;
  try {
    ctx_.control().noteSignature(seq_, sig_);
  } catch (...) {
  }
}

void Exchange::recv(int peer, uint32_t phase, uint32_t chunk, void* dst, size_t bytes,
                    std::function<void()> onArrive, bool urgent) {
  Request* r = ctx_.requests().acquire();
  r->type = Request::Type::kRecv;
  r->owner = this;
  r->peer = peer;
  r->phase = phase;
  r->chunk = chunk;
  r->tag = makeTag(TagClass::kData, seq_, phase, chunk);
  r->payload = dst;
  r->payloadBytes = bytes;
  r->onArrive = std::move(onArrive);
  if (urgent) recvsToPost_.push_front(r);
  else recvsToPost_.push_back(r);
  ++pending_;
}

void Exchange::send(int peer, uint32_t phase, uint32_t chunk, uint64_t offset, const void* src,
                    size_t bytes, std::function<void()> onSent) {
  // Chunks grow past SMDDP_CHUNK_BYTES beyond kMaxChunksPerStream chunks
  // per stream (algorithms.h); a provider with a smaller max_msg_size than
  // that would fail the send inside libfabric, with a less useful error.
  if (const size_t max = maxPayloadBytes(ctx_); bytes > max) {
    throwError(ErrorKind::kInvalidArgument,
               "smddp: " + watch_.what() + ": a message of " + std::to_string(bytes) +
                   " bytes to rank " + std::to_string(peer) + " exceeds provider " +
                   ctx_.provider() + "'s max_msg_size (" + std::to_string(max) +
                   " bytes of payload)");
  }
  Request* r = ctx_.requests().acquire();
  r->type = Request::Type::kSend;
  r->owner = this;
  r->peer = peer;
  r->phase = phase;
  r->chunk = chunk;
  r->tag = makeTag(TagClass::kData, seq_, phase, chunk);
  r->header = makeHeader(FrameKind::kData, ctx_.jobSecret(), seq_, ctx_.rank(), chunk, offset,
                         bytes, sig_);
  r->payload = const_cast<void*>(src);
  r->payloadBytes = bytes;
  r->onArrive = std::move(onSent);
  sendsToPost_.push_back(r);
  ++pending_;
}

bool Exchange::postOne(Request* r) {
    // A send to another host is sealed here, chunk by chunk as the
    // algorithm posts, so one chunk is sealed while the last is on the wire.
    iovec iov[kDataFrameIovs];
    const size_t n = dataFrameIov(ctx_, SealScope::kBetweenHosts, r, r->peer, iov);
    int rc;
    if (r->type == Request::Type::kSend) {
      rc = ctx_.endpoint().postSend(ctx_.peers().addr(r->peer), r->tag, iov, n, &r->ctx);
    } else {
      rc = ctx_.endpoint().postRecv(ctx_.peers().addr(r->peer), r->tag, 0, iov, n, &r->ctx);
    }
    if (rc == -FI_EAGAIN) return false;  // queue full: progress first
    r->posted = true;
    outstanding_.push_back(r);
    if (r->type == Request::Type::kRecv) ++postedRecvs_;
    return true;
}

void Exchange::postPending() {
  // Receives are capped: providers hold a bounded number (shm refuses more
  // than ~1024), and a message whose receive is not posted yet simply waits
  // at the receiver as unexpected. Sends have their own queue so a capped
  // receive queue can never hold them back (that would deadlock the ranks).
  const size_t cap = static_cast<size_t>(ctx_.config().maxPostedRecvs);
  while (!recvsToPost_.empty() && postedRecvs_ < cap) {
    if (!postOne(recvsToPost_.front())) break;
    recvsToPost_.pop_front();
  }
  while (!sendsToPost_.empty()) {
    if (!postOne(sendsToPost_.front())) break;
    sendsToPost_.pop_front();
  }
}

void Exchange::complete(Request* r, const Completion& c) {
  auto it = std::find(outstanding_.begin(), outstanding_.end(), r);
  if (it != outstanding_.end()) outstanding_.erase(it);
  --pending_;
  bool isRecv = r->type == Request::Type::kRecv;
  if (isRecv && r->posted && postedRecvs_ > 0) --postedRecvs_;
  if (!failed_ && !abandoning_) {
    if (c.err == FI_ETRUNC && isRecv) {
      // The peer sent more than this rank expects: the header still landed.
      std::string why;
      FrameExpectation e{ctx_.jobSecret(), seq_, static_cast<uint32_t>(r->peer),
                         static_cast<uint32_t>(ctx_.size()), r->payloadBytes,
                         r->payloadBytes, sig_};
      validateFrame(r->header, sizeof(FrameHeader) + r->payloadBytes, e, &why);
      failed_ = true;
      errorKind_ = ErrorKind::kMismatch;
      error_ = why.empty() || why.find("bytes") != std::string::npos
                   ? "rank " + std::to_string(r->peer) + " sent a larger message than this rank's " +
                         sig_.describe() + " expects"
                   : why;
    } else if (c.err != 0 && c.err != FI_ECANCELED) {
      failed_ = true;
      errorKind_ = ErrorKind::kPeerLost;
      error_ = std::string(isRecv ? "receive from" : "send to") + " rank " +
               std::to_string(r->peer) + " failed: " + c.errText;
    } else if (c.err == 0 && isRecv && c.tag != r->tag) {
      // libfabric handed this receive a message with another tag. Seen with
      // the shm provider of libfabric 1.17 (SAR protocol, several unexpected
      // large messages): a leftover frame of an earlier call that failed
      // here (its sender's send cannot be cancelled) lands in a later
      // receive. A frame of an earlier call is no part of this one: drop it
      // and receive again, the frame this receive is for still comes.
      // Anything else is a transport fault; the header check alone would
      // not catch a same-sized chunk of this very call.
      ctx_.traffic().refused();
      const FrameHeader& h = r->header;
      if (c.len >= sizeof(FrameHeader) && h.magic == kFrameMagic &&
          h.jobSecret == ctx_.jobSecret() && h.seq < seq_) {
        recv(r->peer, r->phase, r->chunk, r->payload, r->payloadBytes, std::move(r->onArrive));
      } else {
        failed_ = true;
        errorKind_ = ErrorKind::kTransport;
        char buf[96];
        snprintf(buf, sizeof(buf), "a message tagged 0x%llx was delivered to a receive tagged 0x%llx",
                 static_cast<unsigned long long>(c.tag), static_cast<unsigned long long>(r->tag));
        error_ = "receive from rank " + std::to_string(r->peer) + " failed: " + buf;
      }
    } else if (c.err == 0 && isRecv) {
      // The sender is r->peer, whose fabric address alone this receive
      // matches (FI_DIRECTED_RECV), never the header's srcRank: seal and
      // key follow from r->peer, and a header naming another is kForeign.
      std::string why;
      FrameExpectation e{ctx_.jobSecret(), seq_, static_cast<uint32_t>(r->peer),
                         static_cast<uint32_t>(ctx_.size()), r->payloadBytes,
                         r->payloadBytes, sig_};
      FrameVerdict v = validateFrame(r->header, framedBytes(ctx_, SealScope::kBetweenHosts, r->peer, c.len), e, &why);
      if (v != FrameVerdict::kOk) {
        ctx_.traffic().refused();
        failed_ = true;
        errorKind_ = v == FrameVerdict::kMismatch ? ErrorKind::kMismatch : ErrorKind::kProtocol;
        error_ = why;
      } else if (!openArrived(ctx_, SealScope::kBetweenHosts, r, r->peer, &why)) {
        // Never published: the algorithm's slot holds garbage the failed
        // call discards.
        failed_ = true;
        errorKind_ = ErrorKind::kProtocol;
        error_ = why;
      } else {
        heardFrom_[static_cast<size_t>(r->peer)] = true;
        ctx_.traffic().received(r->payloadBytes);
        runCallback(r);
      }
    } else if (c.err == 0) {
      ctx_.traffic().sent(r->payloadBytes);
      runCallback(r);
    }
  }
  ctx_.requests().release(r);
}

void Exchange::runCallback(Request* r) {
  if (!r->onArrive) return;
  try {
    r->onArrive();
  } catch (const Error& e) {
    failed_ = true;
    errorKind_ = e.kind();
    error_ = e.what();
  } catch (const std::exception& e) {
    failed_ = true;
    errorKind_ = ErrorKind::kInternal;
    error_ = e.what();
  }
}

std::string Exchange::waitingOn() const {
  std::vector<int> ranks;
  for (Request* r : outstanding_) {
    if (r->type == Request::Type::kRecv &&
        std::find(ranks.begin(), ranks.end(), r->peer) == ranks.end()) {
      ranks.push_back(r->peer);
    }
  }
  std::sort(ranks.begin(), ranks.end());
  std::string s;
  for (int x : ranks) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s.empty() ? "(sends still in flight)" : "rank(s) " + s;
}

std::string Exchange::notSeen() const {
  // A rank has reached this call if one of its frames for it arrived here,
  // or if it sent a stall probe for this sequence number. A rank this call
  // never hears from directly (a small allreduce goes only to its server)
  // can still be told apart: the server stalls too, and probes everyone.
  std::vector<bool> seen = heardFrom_;
  seen[static_cast<size_t>(ctx_.rank())] = true;
  for (int p : ctx_.control().probedAt(seq_)) {
    if (p >= 0 && p < ctx_.size()) seen[static_cast<size_t>(p)] = true;
  }
  std::string s;
  for (int p = 0; p < ctx_.size(); ++p) {
    if (!seen[static_cast<size_t>(p)]) s += (s.empty() ? "" : ", ") + std::to_string(p);
  }
  return s.empty() ? "every rank was seen at this call" : "not seen at this call: rank(s) " + s;
}

void Exchange::fail(ErrorKind kind, const std::string& msg) {
  abandonOutstanding();
  throwError(kind, msg);
}

void Exchange::abandonOutstanding() {
  // The caller releases or reuses the memory this call's messages point
  // into (its tensors, the context's scratch) as soon as the call
  // fails, so nothing posted may still touch it by then. Receives are
  // cancelled, and waited for until each one's completion (the cancel's,
  // or the message's if the provider had already matched it) has been
  // read. Sends cannot be cancelled (shm, rxm), and the provider may read
  // their memory until they complete (rxm serves a rendezvous read from
  // it, shm copies it through its bounce buffers): they are waited for too.
  abandoning_ = true;
  for (Request* r : outstanding_) {
    r->onArrive = nullptr;
    if (r->type != Request::Type::kRecv) {
      ++abandonedSends_;
      ctx_.traffic().sendAbandoned(/*held=*/false);
      continue;
    }
    // 0, or -FI_ENOENT when it was already matched: the completion still
    // comes. Any other code is a provider that cannot cancel; the message
    // that matches it then completes it, so the wait is the same.
    const int rc = ctx_.endpoint().cancel(&r->ctx);
    if (rc != 0 && rc != -FI_ENOENT) cancelRefused_ = rc;
  }
  for (Request* r : recvsToPost_) ctx_.requests().release(r);
  for (Request* r : sendsToPost_) ctx_.requests().release(r);
  recvsToPost_.clear();
  sendsToPost_.clear();
  postedRecvs_ = 0;
  pending_ = 0;
  awaitAbandoned();
}

void Exchange::awaitAbandoned() {
  // A live peer finishes a matched transfer within moments; a stopped or
  // dead one may never, and a send whose receive the peer cancelled never
  // completes at all. Bounded (and cut short by shutdown, which closes the
  // endpoint before anything polls it again): receives for up to 2 s,
  // sends for a short while only. Past the bound, a receive still posted
  // makes the context stop polling its endpoint altogether, so a late
  // completion can never write into memory that has been handed back; a
  // send still posted holds the call's memory (CallMemory::holdForSend)
  // until it completes or shutdown closes the endpoint: a leak, never a
  // use after free. (A quarantined endpoint is never closed, nor
  // progressed: what its operations point into may then go at shutdown.)
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const auto recvsUntil = start + std::min<std::chrono::milliseconds>(
                                      timeout_, std::chrono::milliseconds(2000));
  const auto sendsUntil = start + std::min<std::chrono::milliseconds>(
                                      timeout_, std::chrono::milliseconds(250));
  // Nor for operations whose peers are all known lost (dead, or on a
  // silent host): a transfer the provider had matched can only finish if
  // the link comes back, so stop waiting at once, as when the bounds pass.
  auto allFromLostPeers = [&] {
    return std::all_of(outstanding_.begin(), outstanding_.end(), [&](const Request* r) {
      return r->peer >= 0 && ctx_.peers().lost(r->peer);
    });
  };
  while (!outstanding_.empty() && !ctx_.waits().stopRequested()) {
    bool recvs = false, sends = false;
    for (Request* r : outstanding_) (r->type == Request::Type::kRecv ? recvs : sends) = true;
    const auto now = clock::now();
    if ((!recvs || now >= recvsUntil) && (!sends || now >= sendsUntil)) break;
    if (ctx_.progress() == 0) {
      if (allFromLostPeers()) break;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  size_t sendsLeft = 0;
  int recvPeer = -1;
  for (Request* r : outstanding_) {
    r->owner = nullptr;
    if (r->type == Request::Type::kRecv) {
      if (recvPeer < 0) recvPeer = r->peer;
    } else {
      ctx_.memory().holdForSend(r);
      ++sendsLeft;
    }
  }
  ctx_.traffic().abandonedSendsDone(abandonedSends_ - sendsLeft);
  abandonedSends_ = 0;
  outstanding_.clear();
  if (recvPeer < 0) return;
  const int peer = recvPeer;
  ctx_.quarantine("smddp: " + watch_.what() + ": a receive from rank " + std::to_string(peer) +
                   " could not be confirmed cancelled" +
                   (cancelRefused_ ? std::string(" (fi_cancel: ") + fi_strerror(-cancelRefused_) + ")"
                                   : std::string()) +
                   (ctx_.waits().stopRequested() ? ": the process group was shut down" : ""));
}

void Exchange::run() {
  using clock = std::chrono::steady_clock;
  const auto spin = std::chrono::microseconds(ctx_.config().spinUs);
  const auto maxSleep = std::chrono::microseconds(ctx_.config().sleepUs);
  auto idleSince = clock::now();
  auto sleep = std::chrono::microseconds(1);
  const std::string& what = watch_.what();
  while (pending_ > 0 && !failed_) {
    // Shutdown and abort must not wait out a call stuck on a lost peer.
    if (ctx_.waits().stopRequested()) {
      fail(ErrorKind::kAborted, "smddp: " + what + ": the process group was shut down");
    }
    postPending();
    size_t n = ctx_.progress();
    if (failed_) break;
    if (n > 0) {
      idleSince = clock::now();
      sleep = std::chrono::microseconds(1);
      continue;
    }
    try {
      watch_.check(seq_, &sig_, 1, [&] { return waitingOn(); }, [&] { return notSeen(); });
    } catch (...) {
      abandonOutstanding();
      throw;
    }
    auto now = clock::now();
    if (now - idleSince < spin && aCallerIsWaiting()) {
      // Polling, but let a runnable compute thread have the core.
      sched_yield();
      continue;
    }
    // Idle past the spin budget: back off so we never steal a core that
    // compute needs, capped so latency stays bounded. While no caller
    // waits (DDP's backward computes) the cap is kIdleSleepCap: each
    // wake-up polls the provider's sockets, and at SMDDP_SLEEP_US's 100 us
    // that cost four ranks a third of a core on a link-bound allreduce
    // (docs/notes/2026-11-26-cross-host.md).
    std::this_thread::sleep_for(sleep);
    sleep = std::min(aCallerIsWaiting() ? maxSleep : std::max(maxSleep, kIdleSleepCap), sleep * 2);
  }
  if (failed_) raiseFailure();
}

size_t Exchange::poll() {
  if (ctx_.waits().stopRequested()) {
    fail(ErrorKind::kAborted, "smddp: " + watch_.what() + ": the process group was shut down");
  }
  size_t n = 0;
  if (!failed_) {
    postPending();
    n = ctx_.progress();
  }
  if (failed_) raiseFailure();
  return n;
}

void Exchange::raiseFailure() {
  using clock = std::chrono::steady_clock;
  const std::string& what = watch_.what();
  if (failed_ && errorKind_ == ErrorKind::kPeerLost) {
    // A send or receive that failed with a live peer usually means the peer
    // gave up on this call first (e.g. the shm provider reports EIO when it
    // reads a buffer the peer has already released). The peer posts its own
    // account of the failure before it returns to its caller, so look for
    // it briefly: it names both sides, and a mismatch must not leave the
    // group marked unusable the way a lost peer does. A peer that really
    // died shows up in the liveness checks within the same moment (its
    // sockets all close at once), and their error names it and its host.
    const auto until = clock::now() + std::chrono::milliseconds(100);
    std::string remote;
    do {
      if (ctx_.waits().stopRequested()) break;
      ctx_.progress();
      ErrorKind kind;
      if (ctx_.control().remoteErrorFor(seq_, &remote, &kind)) {
        fail(kind, "smddp: " + what + " failed on another rank: " + remote);
      }
      try {
        ctx_.peers().checkAlive(what);
      } catch (const Error& e) {
        fail(e.kind(), e.what());
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    } while (clock::now() < until);
  }
  fail(errorKind_, "smddp: " + what + ": " + error_);
}

}  // namespace smddp
