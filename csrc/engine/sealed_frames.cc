// Sealed data frames on the peer wire (sealed_frames.h).
#include "engine/sealed_frames.h"

#include "common/error.h"

namespace smddp {

namespace {

// Seals `r`'s payload into a staging buffer of the pool: never in place,
// since the caller's memory is read again (a broadcast root keeps its
// input, a ring reduces into the chunk it forwards).
void sealSend(EngineContext& ctx, Request* r) {
  if (r->payloadBytes) r->staging = ctx.requests().staging(r->peer, r->payloadBytes);
  ctx.seal().seal(r->peer, r->header, r->tag, r->payload, r->staging.data(), r->payloadBytes,
                  &r->trailer);
  r->sealed = true;
  ctx.traffic().sealed(r->payloadBytes);
}

}  // namespace

size_t maxPayloadBytes(EngineContext& ctx) {
  // A sealed frame carries its trailer after the payload.
  const size_t max = ctx.endpoint().maxMessageSize();
  const size_t framing = sizeof(FrameHeader) + (ctx.seal().any() ? kSealTrailerBytes : 0);
  return max > framing ? max - framing : 0;
}

size_t dataFrameIov(EngineContext& ctx, SealScope scope, Request* r, int peer, iovec* iov) {
  const bool send = r->type == Request::Type::kSend;
  const bool sealed = peer >= 0 ? ctx.seal().seals(peer, scope) : ctx.seal().any();
  if (send && sealed && !r->sealed) sealSend(ctx, r);
  size_t n = 0;
  iov[n++] = {&r->header, sizeof(FrameHeader)};
  if (r->payloadBytes) {
    iov[n++] = {send && sealed ? r->staging.data() : r->payload, r->payloadBytes};
  }
  if (sealed) iov[n++] = {&r->trailer, kSealTrailerBytes};
  if (!send) iov[n++] = ctx.memory().overflowSink();
  return n;
}

size_t framedBytes(EngineContext& ctx, SealScope scope, int peer, size_t len) {
  // A frame too short for a trailer is reported by validateFrame as short.
  if (!ctx.seal().seals(peer, scope) || len < sizeof(FrameHeader) + kSealTrailerBytes) return len;
  return len - kSealTrailerBytes;
}

bool openArrived(EngineContext& ctx, SealScope scope, Request* r, int peer, std::string* why) {
  if (!ctx.seal().seals(peer, scope)) {
    if (scope == SealScope::kBetweenHosts || !ctx.seal().any()) return true;
    // Point-to-point in a group that seals: every peer's frames are sealed,
    // so a frame naming no peer with a key (this very rank) is forged.
    ctx.traffic().refused();
    *why = "a data frame claiming to come from rank " + std::to_string(peer) +
           " carries no seal of that rank (SMDDP_WIRE_ENCRYPT): it was forged";
    return false;
  }
  if (ctx.seal().open(peer, r->header, r->tag, r->trailer, r->payload, r->payloadBytes)) {
    ctx.traffic().opened(r->payloadBytes);
    return true;
  }
  ctx.traffic().refused();
  *why = "the data frame from rank " + std::to_string(peer) +
         " failed its integrity check (SMDDP_WIRE_ENCRYPT): it was changed on the way, or "
         "sealed under another key";
  return false;
}

}  // namespace smddp
