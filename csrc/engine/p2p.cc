// Point-to-point send/recv. Unlike collectives they take no sequence number
// (ranks outside the pair must not fall out of step) and never block the
// queue: each is posted in call order and completes in the background, so
// rings of isend/irecv (batch_isend_irecv) cannot deadlock the worker.
// Matching is by (peer, user tag) in posting order, which the provider's
// send-after-send ordering guarantees. Like a collective's, every operation
// is bounded by the group timeout and watched for lost peers; either
// failure leaves the group unusable, as it does for collectives.

#include <rdma/fi_errno.h>

#include <thread>

#include "common/error.h"
#include "engine/communicator.h"
#include "engine/sealed_frames.h"

namespace smddp {

namespace {

std::exception_ptr p2pError(ErrorKind kind, const std::string& msg) {
  return std::make_exception_ptr(Error(kind, "smddp: " + msg));
}

}  // namespace

void Communicator::postP2P(Request* r) {
  EngineContext& ctx = *ctx_;
  if (ctx.control().broken()) {
    throwError(ErrorKind::kAborted,
               "the group is unusable after an earlier failure: " + ctx.control().brokenReason());
  }
  if (const size_t max = maxPayloadBytes(ctx);
      r->type == Request::Type::kSend && r->payloadBytes > max) {
    throwError(ErrorKind::kInvalidArgument,
               "a message of " + std::to_string(r->payloadBytes) + " bytes exceeds provider " +
                   ctx.provider() + "'s max_msg_size (" + std::to_string(max) +
                   " bytes of payload)");
  }
  // Sealed once (to any peer, when the group seals), before the first try.
  iovec iov[kDataFrameIovs];
  const size_t n = dataFrameIov(ctx, SealScope::kEveryPeer, r, r->peer, iov);
  fi_addr_t addr = r->peer >= 0 ? ctx.peers().addr(r->peer) : FI_ADDR_UNSPEC;
  r->deadline = std::chrono::steady_clock::now() + timeout();
  while (true) {
    int rc;
    if (r->type == Request::Type::kSend) {
      rc = ctx.endpoint().postSend(addr, r->tag, iov, n, &r->ctx);
    } else {
      rc = ctx.endpoint().postRecv(addr, r->tag, kP2PAnySourceIgnore, iov, n, &r->ctx);
    }
    if (rc == 0) break;
    ctx.progress();  // queue full: make room
    if (ctx.waits().stopRequested()) {
      throwError(ErrorKind::kAborted, "the process group was shut down");
    }
    if (std::chrono::steady_clock::now() > r->deadline) {
      throwError(ErrorKind::kTimeout, "could not post a point-to-point operation within the timeout");
    }
  }
  r->posted = true;
  ctx.p2p().posted();
}

void Communicator::superviseP2P() {
  const auto now = std::chrono::steady_clock::now();
  for (auto& [raw, owned] : ctx_->requests().live()) {
    if (raw->onComplete && raw->posted && raw->deadline < now) {
      // A send cannot be cancelled (shm, rxm), and a receive the provider
      // already matched may never complete: fail them all here.
      breakP2P(ErrorKind::kTimeout, "timed out after " + std::to_string(timeout().count()) +
                                        " ms");
      return;
    }
  }
  if (now < nextP2PLiveness_) return;
  nextP2PLiveness_ = now + std::chrono::milliseconds(200);
  // A peer that left the group takes and sends nothing more. What it sent
  // before leaving arrives before its notice (one ordered connection), so
  // an operation with it still open 200 ms after both is one it never did.
  for (auto& [raw, owned] : ctx_->requests().live()) {
    std::chrono::steady_clock::time_point left;
    if (!raw->onComplete || !raw->posted || !ctx_->control().leftAt(raw->peer, &left)) continue;
    const auto postedAt = raw->deadline - timeout();
    if (now - std::max(left, postedAt) > std::chrono::milliseconds(200)) {
      breakP2P(ErrorKind::kPeerLost,
               "rank " + std::to_string(raw->peer) + " left the group (it shut its process " +
                   "group down or exited) with a " +
                   (raw->type == Request::Type::kSend ? "send to" : "receive from") +
                   " it still open");
      return;
    }
  }
  try {
    ctx_->peers().checkAlive("point-to-point send/recv");
  } catch (const Error& e) {
    breakP2P(ErrorKind::kPeerLost, e.what());
  }
}

void Communicator::breakP2P(ErrorKind kind, const std::string& why) {
  // Nothing in flight can be trusted to complete or to stay out of its
  // buffers: stop polling the endpoint (which fails what is in flight with
  // `why`), and tell the peers so their next call fails too.
  const std::string reason = std::string("smddp: point-to-point ") +
                             (kind == ErrorKind::kTimeout ? "operation " : "") + why;
  ctx_->p2p().fail(why, kind == ErrorKind::kTimeout);
  ctx_->quarantine(reason);
  ctx_->control().broadcastError(nextSeq_.load(), reason, 0, /*broken=*/true);
}

void Communicator::send(Buffer buf, DataType dtype, int dst, int32_t tag, P2PDone done,
                        CallHooks hooks) {
  SMDDP_CHECK(dst >= 0 && dst < size() && dst != rank(), kInvalidArgument,
              "send: invalid destination rank " + std::to_string(dst));
  auto body = [this, buf, dtype, dst, tag, done, prepare = std::move(hooks.prepare)](EngineContext& ctx, uint64_t) {
    // Fills the staging copy now, in call order (see CallHooks).
    if (prepare) {
      try {
        prepare();
      } catch (const std::exception& e) {
        done(p2pError(ErrorKind::kInternal, "send to rank " + std::to_string(dst) + " (tag " +
                                                std::to_string(tag) + "): " + e.what()),
             dst);
        return;
      }
    }
    Request* r = ctx.requests().acquire();
    r->type = Request::Type::kSend;
    r->peer = dst;
    r->tag = makeP2PTag(tag);
    CollectiveSignature sig{CollectiveType::kSendRecv, dtype, ReduceOp::kSum, buf.numel, -1};
    size_t bytes = buf.numel * elementSize(dtype);
    r->header = makeHeader(FrameKind::kData, ctx.jobSecret(), static_cast<uint32_t>(tag), ctx.rank(), 0,
                           0, bytes, sig);
    r->payload = buf.data;
    r->payloadBytes = bytes;
    r->onComplete = [&ctx, done, dst, tag, bytes](Request* req, const Completion& c) {
      if (c.err == 0) {
        ctx.traffic().sent(bytes);
        done(nullptr, dst);
      } else {
        std::string why = c.errText;
        done(p2pError(req->text == "timed out" ? ErrorKind::kTimeout : ErrorKind::kPeerLost,
                      "send to rank " + std::to_string(dst) + " (tag " + std::to_string(tag) +
                          ") failed: " + why),
             dst);
      }
    };
    try {
      postP2P(r);
    } catch (const Error& e) {
      r->onComplete = nullptr;
      ctx.requests().release(r);
      done(p2pError(e.kind(), "send to rank " + std::to_string(dst) + " (tag " +
                                  std::to_string(tag) + ") refused: " + e.what()),
           dst);
    }
  };
  enqueueP2P("send", std::move(body));
}

void Communicator::recv(Buffer buf, DataType dtype, int src, int32_t tag, P2PDone done) {
  SMDDP_CHECK(src < size() && src != rank(), kInvalidArgument,
              "recv: invalid source rank " + std::to_string(src));
  auto body = [this, buf, dtype, src, tag, done](EngineContext& ctx, uint64_t) {
    Request* r = ctx.requests().acquire();
    r->type = Request::Type::kRecv;
    r->peer = src;  // -1: any source
    r->tag = makeP2PTag(tag);
    r->payload = buf.data;
    r->payloadBytes = buf.numel * elementSize(dtype);
    CollectiveSignature sig{CollectiveType::kSendRecv, dtype, ReduceOp::kSum, buf.numel, -1};
    r->onComplete = [&ctx, done, src, tag, sig](Request* req, const Completion& c) {
      const std::string what = std::string("recv from ") +
                               (src >= 0 ? "rank " + std::to_string(src) : "any rank") + " (tag " +
                               std::to_string(tag) + ")";
      if (c.err != 0) {
        bool timedOut = req->text == "timed out";
        done(p2pError(timedOut ? ErrorKind::kTimeout : ErrorKind::kPeerLost,
                      what + (timedOut ? " " : " failed: ") + c.errText),
             src);
        return;
      }
      const FrameHeader& h = req->header;
      // A receive from a named rank is directed at its fabric address
      // (FI_DIRECTED_RECV), which names the sender. One from any rank
      // (FI_ADDR_UNSPEC) learns it from the header alone, unproven: so a
      // group that seals anything seals point-to-point frames with every
      // peer (SealScope::kEveryPeer), and the claimed rank's key, which
      // only that rank and this one hold, must open the frame, whose seal
      // covers the header; a claim of this very rank opens under no key
      // and is refused (openArrived).
      int from = src >= 0 ? src : (h.srcRank < static_cast<uint32_t>(ctx.size()) ? h.srcRank : 0);
      std::string why;
      FrameExpectation e{ctx.jobSecret(), static_cast<uint32_t>(tag), static_cast<uint32_t>(from),
                         static_cast<uint32_t>(ctx.size()), req->payloadBytes, req->payloadBytes,
                         sig};
      FrameVerdict v = validateFrame(h, framedBytes(ctx, SealScope::kEveryPeer, from, c.len), e, &why);
      if (v != FrameVerdict::kOk) {
        ctx.traffic().refused();
        if (v != FrameVerdict::kMismatch && ctx.seal().any()) {
          why = "a frame claiming rank " + std::to_string(from) + ": " + why +
                " (SMDDP_WIRE_ENCRYPT seals every point-to-point frame; one without that "
                "rank's seal is refused)";
        }
        done(p2pError(v == FrameVerdict::kMismatch ? ErrorKind::kMismatch : ErrorKind::kProtocol,
                      what + ": " + why),
             from);
        return;
      }
      if (!openArrived(ctx, SealScope::kEveryPeer, req, from, &why)) {
        done(p2pError(ErrorKind::kProtocol, what + ": " + why), from);
        return;
      }
      ctx.traffic().received(req->payloadBytes);
      done(nullptr, from);
    };
    try {
      postP2P(r);
    } catch (const Error& e) {
      r->onComplete = nullptr;
      ctx.requests().release(r);
      done(p2pError(e.kind(), std::string("recv from ") +
                                  (src >= 0 ? "rank " + std::to_string(src) : "any rank") +
                                  " (tag " + std::to_string(tag) + ") refused: " + e.what()),
           src);
    }
  };
  enqueueP2P("recv", std::move(body));
}

}  // namespace smddp
