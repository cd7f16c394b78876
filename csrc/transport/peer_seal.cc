// Sealing the peer wire's data frames between hosts (peer_seal.h).
#include "transport/peer_seal.h"

#include <cstring>

#include "common/error.h"
#include "common/param.h"

namespace smddp {

SMDDP_PARAM_BOOL(paramWireEncrypt, "SMDDP_WIRE_ENCRYPT", false,
                 "1 = encrypt the data ranks send each other across hosts (AES-256-GCM under a "
                 "key per direction of each pair, from the group's pair keys; every rank of a "
                 "group must agree, or it fails to form naming this) and every frame to and from "
                 "the standalone reduction servers (under the connection's key; it implies "
                 "SMDDP_SERVER_INTEGRITY, and workers and servers must agree, or they refuse "
                 "each other), so that whoever reads the network learns nothing of the "
                 "gradients. A collective's traffic within a host is not encrypted (it stays in "
                 "shared memory or on loopback); point-to-point messages are, once any peer is "
                 "on another host, so that a receive from any rank proves who sent it")

bool wireEncryptParam() { return paramWireEncrypt(); }

namespace {

void putLe64(uint64_t v, uint8_t* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}

}  // namespace

void sealNonce(uint64_t counter, uint8_t out[kGmacNonceBytes]) {
  std::memset(out, 0, 4);
  putLe64(counter, out + 4);
}

std::string sealAad(const FrameHeader& header, uint64_t counter, uint64_t wireTag) {
  uint8_t tail[16];
  putLe64(counter, tail);
  putLe64(wireTag, tail + 8);
  std::string aad(reinterpret_cast<const char*>(&header), sizeof(FrameHeader));
  aad.append(reinterpret_cast<const char*>(tail), sizeof(tail));
  return aad;
}

PeerSeal PeerSeal::derive(const PeerKeys& keys, const std::vector<bool>& betweenHosts) {
  const int n = keys.size();
  const uint32_t me = static_cast<uint32_t>(keys.rank());
  std::vector<std::string> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
  std::vector<bool> across(static_cast<size_t>(n), false);
  bool anyAcross = false;
  for (int p = 0; p < n && static_cast<size_t>(p) < betweenHosts.size(); ++p) {
    across[static_cast<size_t>(p)] = p != keys.rank() && betweenHosts[static_cast<size_t>(p)];
    anyAcross = anyAcross || across[static_cast<size_t>(p)];
  }
  if (!anyAcross) return PeerSeal();  // one host: nothing leaves it
  for (int p = 0; p < n; ++p) {
    if (p == keys.rank()) continue;
    const uint32_t peer = static_cast<uint32_t>(p);
    send[static_cast<size_t>(p)] = keys.directionKey(kWireEncryptLabel, me, peer);
    recv[static_cast<size_t>(p)] = keys.directionKey(kWireEncryptLabel, peer, me);
  }
  PeerSeal seal(keys.rank(), std::move(send), std::move(recv));
  seal.betweenHosts_ = std::move(across);
  return seal;
}

PeerSeal::PeerSeal(int rank, std::vector<std::string> sendKeys, std::vector<std::string> recvKeys)
    : rank_(rank), sendKeys_(std::move(sendKeys)), recvKeys_(std::move(recvKeys)),
      counters_(sendKeys_.size(), 0), betweenHosts_(sendKeys_.size(), false) {
  SMDDP_CHECK(recvKeys_.size() == sendKeys_.size(), kInternal,
              "smddp: a peer seal needs as many opening keys as sealing keys");
  for (size_t p = 0; p < sendKeys_.size(); ++p) {
    SMDDP_CHECK(sendKeys_[p].empty() == recvKeys_[p].empty(), kInternal,
                "smddp: a peer seal keys both directions of a pair, or neither");
    any_ = any_ || !sendKeys_[p].empty();
    betweenHosts_[p] = !sendKeys_[p].empty();
  }
}

PeerSeal::~PeerSeal() {
  for (auto& k : sendKeys_) wipe(k);
  for (auto& k : recvKeys_) wipe(k);
}

void PeerSeal::seal(int peer, const FrameHeader& header, uint64_t wireTag, const void* in,
                    void* out, size_t n, SealTrailer* trailer) {
  SMDDP_CHECK(keyed(peer), kInternal,
              "smddp: no SMDDP_WIRE_ENCRYPT key for rank " + std::to_string(peer));
  uint64_t& next = counters_[static_cast<size_t>(peer)];
  // 2^64 frames is beyond any job; a nonce must never repeat under a key.
  SMDDP_CHECK(next != UINT64_MAX, kInternal, "smddp: SMDDP_WIRE_ENCRYPT's counter ran out");
  trailer->counter = next++;
  uint8_t nonce[kGmacNonceBytes];
  sealNonce(trailer->counter, nonce);
  const Tag tag = aesGcmSeal(sendKeys_[static_cast<size_t>(peer)], nonce,
                             sealAad(header, trailer->counter, wireTag),
                             static_cast<const uint8_t*>(in), static_cast<uint8_t*>(out), n);
  std::memcpy(trailer->tag, tag.bytes, kTagBytes);
}

bool PeerSeal::open(int peer, const FrameHeader& header, uint64_t wireTag,
                    const SealTrailer& trailer, void* buf, size_t n) const {
  if (!keyed(peer)) return false;
  uint8_t nonce[kGmacNonceBytes];
  sealNonce(trailer.counter, nonce);
  return aesGcmOpen(recvKeys_[static_cast<size_t>(peer)], nonce,
                    sealAad(header, trailer.counter, wireTag), static_cast<const uint8_t*>(buf),
                    static_cast<uint8_t*>(buf), n, trailer.tag);
}

}  // namespace smddp
