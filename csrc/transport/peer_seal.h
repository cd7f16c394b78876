// The bulk half of SMDDP_WIRE_ENCRYPT on the peer wire: AES-256-GCM of the
// data frames a rank sends a rank on another host (the exchange's and
// point-to-point's), under a key per direction derived from the pair's key
// (peer_keys.h). The engine seals a payload into a staging buffer before
// posting it and opens it in place once its header is validated; this file
// holds the keys, the counters and the frame's trailer, no I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/crypto.h"
#include "transport/frame.h"
#include "transport/peer_keys.h"

namespace smddp {

// SMDDP_WIRE_ENCRYPT (0 unless set to 1): the standalone servers' wire
// (server/) and, between hosts, the peer wire (here).
bool wireEncryptParam();

// What K(a->b) is derived from: HMAC-SHA256(pair key, label || a || b).
inline constexpr char kWireEncryptLabel[] = "smddp wire encrypt v1";

// After a sealed payload, in its own iov: the sender's counter for this
// direction (the nonce is 4 zero bytes, then these 8) and the GCM tag.
struct SealTrailer {
  uint64_t counter = 0;  // little-endian on the wire (x86, as the header)
  uint8_t tag[kTagBytes] = {};
};
static_assert(sizeof(SealTrailer) == 24, "a sealed frame's trailer is 24 bytes");
constexpr size_t kSealTrailerBytes = sizeof(SealTrailer);

// The 12-byte GCM nonce of `counter`: 32 zero bits, then the counter.
void sealNonce(uint64_t counter, uint8_t out[kGmacNonceBytes]);

// Which of a pair's frames are sealed. The exchange's receives are
// directed (FI_DIRECTED_RECV: the fabric address names the sender), so it
// seals only what crosses hosts. A point-to-point receive from any rank
// learns its sender from the frame's own header, which nothing but a seal
// proves: once a group seals anything, point-to-point frames are sealed
// with every peer, and a frame claiming a rank on this host opens only
// under that rank's key.
enum class SealScope { kBetweenHosts, kEveryPeer };

// One rank's keys for the peers whose frames it seals. Built once at
// formation and read by the worker thread (or a caller running its own
// call), which alone advances the counters: one writer.
class PeerSeal {
 public:
  PeerSeal() = default;  // seals nothing
  // This rank's keys: when any `betweenHosts[p]` (the peers on other
  // hosts), K(rank->p) to seal and K(p->rank) to open for every peer p
  // (SealScope); none when no peer is on another host.
  static PeerSeal derive(const PeerKeys& keys, const std::vector<bool>& betweenHosts);
  // The same from keys given outright (tests): `sendKeys[p]` seals frames
  // to p, `recvKeys[p]` opens p's; empty strings for peers left plain.
  // Every keyed peer counts as on another host.
  PeerSeal(int rank, std::vector<std::string> sendKeys, std::vector<std::string> recvKeys);
  PeerSeal(PeerSeal&&) = default;
  PeerSeal& operator=(PeerSeal&&) = default;
  ~PeerSeal();  // wipes the keys

  // Whether frames of `scope` to and from `peer` are sealed.
  bool seals(int peer, SealScope scope = SealScope::kBetweenHosts) const {
    if (!keyed(peer)) return false;
    return scope == SealScope::kEveryPeer || betweenHosts_[static_cast<size_t>(peer)];
  }
  bool any() const { return any_; }

  // Encrypts `n` bytes of `in` into `out` (never the caller's memory: the
  // caller may read it again) for `peer` (keyed in some scope), with the next counter of that
  // direction, and fills `trailer`. The tag covers `header`, the counter
  // and `wireTag` (the message's 64-bit tag, which carries the phase the
  // header lacks), so a frame moved to another receive fails to open.
  void seal(int peer, const FrameHeader& header, uint64_t wireTag, const void* in, void* out,
            size_t n, SealTrailer* trailer);
  // Decrypts `n` bytes from `peer` in place at `buf`; false when the tag
  // does not match (then `buf` holds garbage the caller must discard).
  bool open(int peer, const FrameHeader& header, uint64_t wireTag, const SealTrailer& trailer,
            void* buf, size_t n) const;
  // Frames sealed to `peer` so far (its next counter).
  uint64_t sealedTo(int peer) const { return counters_.at(static_cast<size_t>(peer)); }

 private:
  int rank_ = -1;
  bool any_ = false;
  std::vector<std::string> sendKeys_;  // by peer; empty: not sealed
  std::vector<std::string> recvKeys_;
  std::vector<uint64_t> counters_;     // next counter by peer: worker thread only
  std::vector<bool> betweenHosts_;     // by peer: the exchange seals its frames too

  bool keyed(int peer) const {
    return peer >= 0 && static_cast<size_t>(peer) < sendKeys_.size() &&
           !sendKeys_[static_cast<size_t>(peer)].empty();
  }
};

// The additional data a sealed frame's tag covers: the 72-byte header,
// the counter, then the message's tag (both little-endian).
std::string sealAad(const FrameHeader& header, uint64_t counter, uint64_t wireTag);

}  // namespace smddp
