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

namespace smddp {

namespace {

std::exception_ptr p2pError(ErrorKind kind, const std::string& msg) {
  return std::make_exception_ptr(Error(kind, "smddp: " + msg));
}

}  // namespace

void Communicator::postP2P(Request* r) {
  if (control_.broken()) {
    throwError(ErrorKind::kAborted,
               "the group is unusable after an earlier failure: " + control_.brokenReason());
  }
  iovec iov[3];
  size_t n = 0;
  iov[n++] = {&r->header, sizeof(FrameHeader)};
  if (r->payloadBytes) iov[n++] = {r->payload, r->payloadBytes};
  fi_addr_t addr = r->peer >= 0 ? peers_.addr(r->peer) : FI_ADDR_UNSPEC;
  r->deadline = std::chrono::steady_clock::now() + timeout();
  while (true) {
    int rc;
    if (r->type == Request::Type::kSend) {
      rc = endpoint_->postSend(addr, r->tag, iov, n, &r->ctx);
    } else {
      iov[n] = overflowSink();
      rc = endpoint_->postRecv(addr, r->tag, kP2PAnySourceIgnore, iov, n + 1, &r->ctx);
    }
    if (rc == 0) break;
    progress();  // queue full: make room
    if (stopRequested()) throwError(ErrorKind::kAborted, "the process group was shut down");
    if (std::chrono::steady_clock::now() > r->deadline) {
      throwError(ErrorKind::kTimeout, "could not post a point-to-point operation within the timeout");
    }
  }
  r->posted = true;
  ++p2pInFlight_;
}

void Communicator::superviseP2P() {
  const auto now = std::chrono::steady_clock::now();
  for (auto& [raw, owned] : requests_.live()) {
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
  try {
    peers_.checkAlive("point-to-point send/recv");
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
  failP2P(why, kind == ErrorKind::kTimeout);
  quarantine(reason);
  control_.broadcastError(nextSeq_.load(), reason, 0, /*broken=*/true);
}

void Communicator::failP2P(const std::string& why, bool timedOut) {
  std::vector<Request*> p2p;
  for (auto& [raw, owned] : requests_.live()) {
    if (raw->onComplete) p2p.push_back(raw);
  }
  for (Request* r : p2p) {
    Completion c;
    c.err = FI_ECANCELED;
    c.errText = why;
    if (timedOut) r->text = "timed out";
    auto onComplete = std::move(r->onComplete);
    r->onComplete = nullptr;
    if (r->posted && p2pInFlight_ > 0) --p2pInFlight_;
    try {
      onComplete(r, c);
    } catch (...) {
    }
    if (r->posted) {
      // The provider still holds the operation, and may still read (a send)
      // or write (a receive) its buffer: the completion, which owns that
      // buffer in the backend, stays with the request until the provider
      // completes it or shutdown closes the endpoint.
      r->held = std::make_shared<HeldMemory>();
      r->held->owners.push_back([keep = std::move(onComplete)] {});
      if (r->type == Request::Type::kSend) {
        stats_.abandonedSends++;
        stats_.abandonedSendsHeld++;
      }
    }
  }
}

void Communicator::send(Buffer buf, DataType dtype, int dst, int32_t tag, P2PDone done,
                        CallHooks hooks) {
  SMDDP_CHECK(dst >= 0 && dst < opts_.size && dst != opts_.rank, kInvalidArgument,
              "send: invalid destination rank " + std::to_string(dst));
  auto body = [this, buf, dtype, dst, tag, done, prepare = std::move(hooks.prepare)](uint64_t) {
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
    Request* r = requests_.acquire();
    r->type = Request::Type::kSend;
    r->peer = dst;
    r->tag = makeP2PTag(tag);
    CollectiveSignature sig{CollectiveType::kSendRecv, dtype, ReduceOp::kSum, buf.numel, -1};
    size_t bytes = buf.numel * elementSize(dtype);
    r->header = makeHeader(FrameKind::kData, jobSecret_, static_cast<uint32_t>(tag), opts_.rank, 0,
                           0, bytes, sig);
    r->payload = buf.data;
    r->payloadBytes = bytes;
    r->onComplete = [this, done, dst, tag, bytes](Request* req, const Completion& c) {
      if (c.err == 0) {
        stats_.bytesSent += bytes;
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
      requests_.release(r);
      done(p2pError(e.kind(), "send to rank " + std::to_string(dst) + " (tag " +
                                  std::to_string(tag) + ") refused: " + e.what()),
           dst);
    }
  };
  enqueueP2P("send", std::move(body));
}

void Communicator::recv(Buffer buf, DataType dtype, int src, int32_t tag, P2PDone done) {
  SMDDP_CHECK(src < opts_.size && src != opts_.rank, kInvalidArgument,
              "recv: invalid source rank " + std::to_string(src));
  auto body = [this, buf, dtype, src, tag, done](uint64_t) {
    Request* r = requests_.acquire();
    r->type = Request::Type::kRecv;
    r->peer = src;  // -1: any source
    r->tag = makeP2PTag(tag);
    r->payload = buf.data;
    r->payloadBytes = buf.numel * elementSize(dtype);
    CollectiveSignature sig{CollectiveType::kSendRecv, dtype, ReduceOp::kSum, buf.numel, -1};
    r->onComplete = [this, done, src, tag, sig](Request* req, const Completion& c) {
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
      int from = src >= 0 ? src : (h.srcRank < static_cast<uint32_t>(opts_.size) ? h.srcRank : 0);
      std::string why;
      FrameExpectation e{jobSecret_, static_cast<uint32_t>(tag), static_cast<uint32_t>(from),
                         static_cast<uint32_t>(opts_.size), req->payloadBytes, req->payloadBytes,
                         sig};
      FrameVerdict v = validateFrame(h, c.len, e, &why);
      if (v != FrameVerdict::kOk) {
        stats_.framesRejected++;
        done(p2pError(v == FrameVerdict::kMismatch ? ErrorKind::kMismatch : ErrorKind::kProtocol,
                      what + ": " + why),
             from);
        return;
      }
      stats_.bytesReceived += req->payloadBytes;
      done(nullptr, from);
    };
    try {
      postP2P(r);
    } catch (const Error& e) {
      r->onComplete = nullptr;
      requests_.release(r);
      done(p2pError(e.kind(), std::string("recv from ") +
                                  (src >= 0 ? "rank " + std::to_string(src) : "any rank") +
                                  " (tag " + std::to_string(tag) + ") refused: " + e.what()),
           src);
    }
  };
  enqueueP2P("recv", std::move(body));
}

}  // namespace smddp
