// The messages of the liveness connections (peer_monitor.h), shared by the
// monitor's loop (peer_monitor.cc) and its link set-up
// (peer_monitor_links.cc).
#pragma once

#include <cstddef>
#include <cstdint>

namespace smddp::liveness {

// Every message on a liveness connection: fixed size, carrying the group's
// secret, so bytes from anyone else are refused before they mean anything.
// kBusy is the one without it: a listener full of connections that owe
// their hello (a flood) tells the one it turns away, which may be a real
// peer's, to come again; it knows no secret yet, and it only ever means
// "retry".
enum : uint8_t { kHello = 1, kBeat = 2, kBye = 3, kBusy = 4 };
constexpr uint32_t kMagic = 0x4C444D53;  // "SMDL"
constexpr uint8_t kVersion = 1;

struct Message {
  uint32_t magic;
  uint8_t version;
  uint8_t type;
  uint16_t reserved;
  uint32_t from;    // sender's rank
  uint32_t to;      // receiver's rank
  uint64_t secret;  // the group's secret
};
static_assert(sizeof(Message) == 24, "liveness messages are 24 bytes");

constexpr size_t kMaxPending = 64;     // accepted connections still owing a hello
constexpr uint32_t kAnyone = 0xFFFFFFFF;  // a busy message's `to`: the listener cannot know

}  // namespace smddp::liveness
