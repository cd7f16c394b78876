// Pairwise keys of a group's ranks (peer_keys.h).
#include "transport/peer_keys.h"

#include <algorithm>
#include <cstring>

#include "common/crypto.h"
#include "common/error.h"

namespace smddp {

namespace {

std::string u32(uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), 4); }

std::string macKey(const Mac& m) {
  return std::string(reinterpret_cast<const char*>(m.bytes), kMacBytes);
}

// The key of `rank` and `peer`: HMAC-SHA256 under their shared secret of
// the group, both ranks and both public keys (the lower rank first, so
// both compute the same key).
std::string pairKey(const std::string& shared, int rank, int peer,
                    const std::vector<std::string>& publicKeys, std::string_view groupId,
                    std::string_view preShared) {
  const int lo = std::min(rank, peer), hi = std::max(rank, peer);
  const std::string loText = u32(static_cast<uint32_t>(lo));
  const std::string hiText = u32(static_cast<uint32_t>(hi));
  std::string key = macKey(hmacSha256(shared, {"smddp peer key v1", groupId, loText, hiText,
                                              publicKeys[lo], publicKeys[hi]}));
  if (!preShared.empty()) {
    // Whoever could write into the store (and so swap public keys, to sit
    // in the middle) still lacks the key file's key.
    key = macKey(hmacSha256(preShared, {"smddp peer key file v1", groupId, key}));
  }
  return key;
}

}  // namespace

PeerKeys PeerKeys::derive(int rank, std::string_view privateKey,
                          const std::vector<std::string>& publicKeys, std::string_view groupId,
                          std::string_view preShared) {
  const int n = static_cast<int>(publicKeys.size());
  SMDDP_CHECK(rank >= 0 && rank < n, kInvalidArgument,
              "rank " + std::to_string(rank) + " is not in a group of " + std::to_string(n));
  PeerKeys out;
  out.rank_ = rank;
  out.keys_.resize(n);
  for (int p = 0; p < n; ++p) {
    if (p == rank) continue;
    std::string shared = x25519SharedSecret(privateKey, publicKeys[p], "rank " + std::to_string(p));
    out.keys_[p] = pairKey(shared, rank, p, publicKeys, groupId, preShared);
    wipe(shared);
  }
  return out;
}

PeerMac PeerKeys::mac(uint32_t from, uint32_t to, std::string_view head,
                      std::string_view body) const {
  const int peer = static_cast<int>(from == static_cast<uint32_t>(rank_) ? to : from);
  SMDDP_CHECK((from == static_cast<uint32_t>(rank_) || to == static_cast<uint32_t>(rank_)) &&
                  has(peer),
              kInternal, "smddp: no peer key for rank " + std::to_string(peer));
  const Mac full = hmacSha256(keys_[peer], {"smddp peer mac v1", u32(from), u32(to), head, body});
  PeerMac out;
  std::memcpy(out.bytes, full.bytes, kPeerMacBytes);
  return out;
}

bool PeerKeys::verify(uint32_t from, std::string_view head, std::string_view body,
                      const uint8_t* mac) const {
  if (from > static_cast<uint32_t>(INT32_MAX) || !has(static_cast<int>(from))) return false;
  const PeerMac want = this->mac(from, static_cast<uint32_t>(rank_), head, body);
  return bytesEqual(want.bytes, mac, kPeerMacBytes);
}

std::string PeerKeys::directionKey(std::string_view label, uint32_t from, uint32_t to) const {
  const int peer = static_cast<int>(from == static_cast<uint32_t>(rank_) ? to : from);
  SMDDP_CHECK((from == static_cast<uint32_t>(rank_) || to == static_cast<uint32_t>(rank_)) &&
                  has(peer),
              kInternal, "smddp: no peer key for rank " + std::to_string(peer));
  return macKey(hmacSha256(keys_[peer], {label, u32(from), u32(to)}));
}

}  // namespace smddp
