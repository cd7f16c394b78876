// The keys each pair of a group's ranks shares (docs/design.md, "Security"),
// which MAC the peer wire's control frames (transport/frame.h) and liveness
// messages (liveness_message.h). Every rank makes an ephemeral X25519 key
// pair at formation and publishes only its public half in the store; the
// pair's key is derived from their shared secret, the group and, when the
// job has a key file, that key, so nobody who only reads the wire or the
// store learns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace smddp {

constexpr size_t kPeerMacBytes = 16;  // HMAC-SHA256, truncated
struct PeerMac {
  uint8_t bytes[kPeerMacBytes] = {};
};

class PeerKeys {
 public:
  PeerKeys() = default;  // no keys: every MAC check fails
  // This rank's keys with each of `publicKeys.size()` ranks: X25519 of
  // `privateKey` and the peer's public key, through HMAC-SHA256 with the
  // group's instance (`groupId`), both ranks and both public keys, and,
  // when `preShared` is not empty, keyed again with it. Throws
  // kInvalidArgument naming the rank whose public key is unusable.
  static PeerKeys derive(int rank, std::string_view privateKey,
                         const std::vector<std::string>& publicKeys, std::string_view groupId,
                         std::string_view preShared);

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(keys_.size()); }
  // A key is held for `peer`: a rank of the group other than this one.
  bool has(int peer) const {
    return peer >= 0 && peer < size() && peer != rank_ && !keys_[peer].empty();
  }
  // The MAC of `head` then `body` sent from `from` to `to` (one of them
  // this rank) under their pair's key, with both ranks bound in: a message
  // MACed for another pair or the other direction does not verify. Throws
  // kInternal when no key is held for the pair.
  PeerMac mac(uint32_t from, uint32_t to, std::string_view head, std::string_view body = {}) const;
  // Whether `mac` (kPeerMacBytes) is that of `head` and `body` from `from`
  // to this rank; false (never a throw) for a sender with no key here.
  bool verify(uint32_t from, std::string_view head, std::string_view body,
              const uint8_t* mac) const;
  // A 32-byte key for one direction of a pair, `from` to `to` (one of them
  // this rank): HMAC-SHA256 under the pair's key of `label`, then both
  // ranks (4 bytes each, little-endian). The two directions differ, so a
  // use that keys each direction apart (transport/peer_seal.h) needs no
  // direction bit in its nonces. Throws kInternal when no key is held.
  std::string directionKey(std::string_view label, uint32_t from, uint32_t to) const;

 private:
  int rank_ = -1;
  std::vector<std::string> keys_;  // by peer rank; empty for this rank
};

}  // namespace smddp
