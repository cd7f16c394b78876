// Limits of the wire, shared by those who make tags and messages
// (transport/) and those who cut a collective into chunks (reduce/,
// algorithms/, hostpath/), so that those layers need nothing from the
// transport.
#pragma once

#include <cstdint>

namespace smddp {

// The tag's chunk field is 24 bits: a phase of one collective has at most
// this many chunks (makeTag throws past it; the shard plan refuses first).
constexpr uint32_t kMaxChunksPerPhase = 1u << 24;

// The largest message rxm sends eager (FI_OFI_RXM_EAGER_LIMIT, which
// transport/fabric.cc sets unless the user did), header included: one just
// past it goes by rendezvous, a round trip per message. A 256 KiB chunk
// plus its frame header is past it; bulk exchanges that must run at the
// link's rate cut their messages to kEagerPayloadBytes (2 x 2 hosts at
// 2 Gbit/s, 64 MiB reduce-scatter: 62% of the link bound at 256 KiB, 97%
// at 248 KiB; docs/notes/2026-12-04-hierarchy-gather-scatter.md).
inline constexpr uint64_t kRxmEagerLimitBytes = 262144;
inline constexpr uint64_t kEagerPayloadBytes = kRxmEagerLimitBytes - 8192;

}  // namespace smddp
