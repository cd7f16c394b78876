// How a data frame travels when SMDDP_WIRE_ENCRYPT seals it (between
// hosts; transport/peer_seal.h): the iov a send or receive posts, the
// seal of a send's payload into its staging buffer, and the opening of an
// arrived payload in place once its header is validated. Shared by the
// exchange (a collective's messages) and point-to-point, so both post and
// check the same wire.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <string>

#include "engine/engine_context.h"
#include "engine/request.h"

namespace smddp {

// The most iov entries dataFrameIov writes: header, payload, trailer and
// the overflow sink of a receive.
constexpr size_t kDataFrameIovs = 4;

// The longest payload one data frame may carry: the provider's
// max_msg_size less the frame header and, when the group seals any peer's
// frames, the trailer. Every provider here takes any size (SIZE_MAX); a
// message past it fails naming the limit instead of inside the provider
// (Exchange::send, point-to-point sends). Fixed once the group is formed.
size_t maxPayloadBytes(EngineContext& ctx);

// Each function takes the frame's scope (transport/peer_seal.h): the
// exchange's frames are sealed between hosts, point-to-point's with every
// peer once the group seals any.
//
// The iov of data frame `r` to or from `peer` (-1: a receive from any
// rank, which makes room for a trailer if any peer's frames are sealed).
// A send to a sealed peer is sealed on the first call (a post retried
// after a full queue reuses it); a receive ends in the overflow sink.
// Returns the entries written.
size_t dataFrameIov(EngineContext& ctx, SealScope scope, Request* r, int peer, iovec* iov);

// What of a completion of `len` bytes from `peer` is header and payload
// (what validateFrame checks): a sealed frame's trailer is not.
size_t framedBytes(EngineContext& ctx, SealScope scope, int peer, size_t len);

// After `r`'s header from `peer` was validated: opens its payload in place
// when the pair is sealed. False with `why` (naming the peer and
// SMDDP_WIRE_ENCRYPT) when the tag does not match; the payload then holds
// garbage that must never be published.
bool openArrived(EngineContext& ctx, SealScope scope, Request* r, int peer, std::string* why);

}  // namespace smddp
