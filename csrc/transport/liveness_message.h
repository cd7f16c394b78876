// The messages of the liveness connections (peer_monitor.h), shared by the
// monitor's loop (peer_monitor.cc) and its link set-up
// (peer_monitor_links.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "transport/peer_keys.h"

namespace smddp::liveness {

// Every message on a liveness connection: fixed size, with the MAC of its
// sender and receiver's pair key (peer_keys.h) over the rest, so bytes
// from anyone else, a message MACed for another pair or direction, and a
// replayed one (its counter is not above the last one heard) are refused
// before they mean anything. kBusy is the one without a MAC: a listener
// full of connections that owe their hello (a flood) tells the one it
// turns away, which may be a real peer's, to come again; it cannot know
// whose it is, and it only ever means "retry".
enum : uint8_t { kHello = 1, kBeat = 2, kBye = 3, kBusy = 4 };
constexpr uint32_t kMagic = 0x4C444D53;  // "SMDL"
constexpr uint8_t kVersion = 3;           // 3: a goodbye says which call its sender left before
constexpr uint64_t kNoCall = UINT64_MAX;  // `leftBefore` of every message but a goodbye

struct Message {
  uint32_t magic;
  uint8_t version;
  uint8_t type;
  uint16_t reserved;
  uint32_t from;     // sender's rank
  uint32_t to;       // receiver's rank
  uint64_t counter;  // the sender's messages to `to`, from 1: never repeats
  // A goodbye: the first call of the group its sender never ran (it left
  // before it), so a peer in that call or a later one fails at once;
  // kNoCall when unknown, and in every other message.
  uint64_t leftBefore;
  uint8_t mac[kPeerMacBytes];
};
static_assert(sizeof(Message) == 48, "liveness messages are 48 bytes");
constexpr size_t kMacCovers = 32;  // every field before the MAC

inline Message sealedMessage(const PeerKeys& keys, uint8_t type, uint32_t from, uint32_t to,
                             uint64_t counter, uint64_t leftBefore = kNoCall) {
  Message m{kMagic, kVersion, type, 0, from, to, counter, leftBefore, {}};
  const PeerMac mac = keys.mac(from, to, std::string_view(reinterpret_cast<const char*>(&m),
                                                          kMacCovers));
  std::memcpy(m.mac, mac.bytes, kPeerMacBytes);
  return m;
}

// Whether `m` carries the MAC of its `from` and this rank's key.
inline bool authentic(const PeerKeys& keys, const Message& m) {
  return keys.verify(m.from, std::string_view(reinterpret_cast<const char*>(&m), kMacCovers), {},
                     m.mac);
}

constexpr size_t kMaxPending = 64;     // accepted connections still owing a hello
constexpr uint32_t kAnyone = 0xFFFFFFFF;  // a busy message's `to`: the listener cannot know

}  // namespace smddp::liveness
