// SMDDP_WIRE_ENCRYPT's framing on the peer wire (transport/peer_seal.h):
// a sealed payload against OpenSSL's AES-256-GCM called directly under the
// nonce and additional data the header documents, the round trip at the
// peer, each part of a frame an attacker could change (header, payload,
// counter, tag, the message's tag) failing to open, and the keys per
// direction against an independent derivation from X25519 and HMAC.
#include <catch2/catch.hpp>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/crypto.h"
#include "transport/frame.h"
#include "transport/peer_keys.h"
#include "transport/peer_seal.h"

using namespace smddp;

namespace {

constexpr uint64_t kSecret = 0x0123456789abcdefULL;
constexpr uint64_t kWireTag = 0x0000002a10000003ULL;  // any 64 bits: it is only covered

FrameHeader headerFor(uint32_t from, size_t bytes) {
  const CollectiveSignature sig{CollectiveType::kAllreduce, DataType::kFloat32, ReduceOp::kSum,
                                bytes / 4, -1};
  return makeHeader(FrameKind::kData, kSecret, 7, from, 3, 4096, bytes, sig);
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 131 + seed);
  return v;
}

void le64(uint64_t v, uint8_t* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}

// AES-256-GCM through OpenSSL's EVP interface, written out from the
// format: nonce = 4 zero bytes || LE64(counter); AAD = header ||
// LE64(counter) || LE64(wire tag). Returns the ciphertext; `tag` gets the tag.
std::vector<uint8_t> opensslSeal(const std::string& key, const FrameHeader& h, uint64_t counter,
                                 uint64_t wireTag, const std::vector<uint8_t>& plain,
                                 uint8_t tag[16]) {
  uint8_t nonce[12] = {};
  le64(counter, nonce + 4);
  std::vector<uint8_t> aad(sizeof(FrameHeader) + 16);
  std::memcpy(aad.data(), &h, sizeof(FrameHeader));
  le64(counter, aad.data() + sizeof(FrameHeader));
  le64(wireTag, aad.data() + sizeof(FrameHeader) + 8);
  std::unique_ptr<EVP_CIPHER_CTX, void (*)(EVP_CIPHER_CTX*)> c(EVP_CIPHER_CTX_new(),
                                                                 EVP_CIPHER_CTX_free);
  std::vector<uint8_t> out(plain.size());
  int len = 0;
  REQUIRE(EVP_EncryptInit_ex(c.get(), EVP_aes_256_gcm(), nullptr,
                             reinterpret_cast<const unsigned char*>(key.data()), nonce) == 1);
  REQUIRE(EVP_EncryptUpdate(c.get(), nullptr, &len, aad.data(), static_cast<int>(aad.size())) == 1);
  if (!plain.empty()) {
    REQUIRE(EVP_EncryptUpdate(c.get(), out.data(), &len, plain.data(),
                              static_cast<int>(plain.size())) == 1);
  }
  REQUIRE(EVP_EncryptFinal_ex(c.get(), nullptr, &len) == 1);
  REQUIRE(EVP_CIPHER_CTX_ctrl(c.get(), EVP_CTRL_GCM_GET_TAG, 16, tag) == 1);
  return out;
}

// Two ranks' seals with keys given outright: K(0->1) and K(1->0).
struct TwoSeals {
  std::string k01 = std::string(32, '\x11'), k10 = std::string(32, '\x22');
  PeerSeal at0{0, {"", k01}, {"", k10}};
  PeerSeal at1{1, {k10, ""}, {k01, ""}};
};

}  // namespace

TEST_CASE("a sealed frame is OpenSSL's AES-256-GCM of its payload under the documented nonce "
          "and additional data, and opens to its input at the peer",
          "[peer_seal]") {
  TwoSeals s;
  for (size_t n : {size_t{0}, size_t{1}, size_t{4096}, size_t{262147}}) {
    CAPTURE(n);
    const auto plain = pattern(n, static_cast<uint8_t>(n));
    const FrameHeader h = headerFor(0, n);
    std::vector<uint8_t> staging(n);
    SealTrailer t;
    s.at0.seal(1, h, kWireTag, plain.data(), staging.data(), n, &t);
    uint8_t wantTag[16];
    const auto want = opensslSeal(s.k01, h, t.counter, kWireTag, plain, wantTag);
    CHECK(staging == want);
    CHECK(std::memcmp(t.tag, wantTag, 16) == 0);
    CHECK(plain == pattern(n, static_cast<uint8_t>(n)));  // the input is never written
    REQUIRE(s.at1.open(0, h, kWireTag, t, staging.data(), n));
    CHECK(staging == plain);
  }
  // One counter per direction, advancing per frame: the same payload never
  // seals the same way twice.
  CHECK(s.at0.sealedTo(1) == 4);
  CHECK(s.at1.sealedTo(0) == 0);
  const auto plain = pattern(64, 9);
  std::vector<uint8_t> a(64), b(64);
  SealTrailer ta, tb;
  s.at0.seal(1, headerFor(0, 64), kWireTag, plain.data(), a.data(), 64, &ta);
  s.at0.seal(1, headerFor(0, 64), kWireTag, plain.data(), b.data(), 64, &tb);
  CHECK(tb.counter == ta.counter + 1);
  CHECK(a != b);
  // Peers left plain (same host) have no key.
  CHECK_FALSE(s.at0.seals(0));
  CHECK_FALSE(PeerSeal().any());
  SealTrailer none;
  CHECK_THROWS_WITH(s.at0.seal(0, headerFor(0, 64), kWireTag, plain.data(), a.data(), 64, &none),
                    Catch::Contains("SMDDP_WIRE_ENCRYPT"));
}

TEST_CASE("a sealed frame with any part changed fails to open: header, payload, counter, tag, "
          "the message's tag, or the other direction",
          "[peer_seal]") {
  TwoSeals s;
  const size_t n = 1000;
  const auto plain = pattern(n, 5);
  FrameHeader h = headerFor(0, n);
  std::vector<uint8_t> wire(n);
  SealTrailer t;
  s.at0.seal(1, h, kWireTag, plain.data(), wire.data(), n, &t);
  auto opens = [&](const FrameHeader& hh, uint64_t tag, const SealTrailer& tt,
                   std::vector<uint8_t> buf, const PeerSeal& at, int from) {
    return at.open(from, hh, tag, tt, buf.data(), buf.size());
  };
  REQUIRE(opens(h, kWireTag, t, wire, s.at1, 0));

  SECTION("header: the offset, the sequence or the sender") {
    FrameHeader moved = h;
    moved.offset += 4;
    CHECK_FALSE(opens(moved, kWireTag, t, wire, s.at1, 0));
    moved = h;
    moved.seq += 1;
    CHECK_FALSE(opens(moved, kWireTag, t, wire, s.at1, 0));
    moved = h;
    reinterpret_cast<uint8_t*>(&moved)[sizeof(FrameHeader) - 1] ^= 1;
    CHECK_FALSE(opens(moved, kWireTag, t, wire, s.at1, 0));
  }
  SECTION("payload: one bit, or one byte short") {
    auto bad = wire;
    bad[n / 2] ^= 0x10;
    CHECK_FALSE(opens(h, kWireTag, t, bad, s.at1, 0));
    bad = wire;
    bad.pop_back();
    CHECK_FALSE(opens(h, kWireTag, t, bad, s.at1, 0));
  }
  SECTION("counter") {
    SealTrailer bad = t;
    bad.counter ^= 1;
    CHECK_FALSE(opens(h, kWireTag, bad, wire, s.at1, 0));
  }
  SECTION("tag") {
    SealTrailer bad = t;
    bad.tag[0] ^= 0x80;
    CHECK_FALSE(opens(h, kWireTag, bad, wire, s.at1, 0));
  }
  SECTION("the message's tag: the same frame delivered to another phase's receive") {
    CHECK_FALSE(opens(h, kWireTag ^ (1ULL << 24), t, wire, s.at1, 0));
  }
  SECTION("reflected: rank 0 handed its own frame back as rank 1's") {
    CHECK_FALSE(opens(h, kWireTag, t, wire, s.at0, 1));
  }
}

namespace {

std::string rawKey(uint8_t fill) { return std::string(kX25519Bytes, static_cast<char>(fill)); }

// X25519 through OpenSSL's EVP interface.
std::string opensslX25519(const std::string& priv, const std::string& pub) {
  using Key = std::unique_ptr<EVP_PKEY, void (*)(EVP_PKEY*)>;
  Key mine(EVP_PKEY_new_raw_private_key(EVP_PKEY_X25519, nullptr,
                                        reinterpret_cast<const unsigned char*>(priv.data()), 32),
           EVP_PKEY_free);
  Key theirs(EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, nullptr,
                                         reinterpret_cast<const unsigned char*>(pub.data()), 32),
             EVP_PKEY_free);
  std::unique_ptr<EVP_PKEY_CTX, void (*)(EVP_PKEY_CTX*)> c(EVP_PKEY_CTX_new(mine.get(), nullptr),
                                                           EVP_PKEY_CTX_free);
  std::string out(32, '\0');
  size_t len = out.size();
  REQUIRE(EVP_PKEY_derive_init(c.get()) == 1);
  REQUIRE(EVP_PKEY_derive_set_peer(c.get(), theirs.get()) == 1);
  REQUIRE(EVP_PKEY_derive(c.get(), reinterpret_cast<unsigned char*>(out.data()), &len) == 1);
  return out;
}

std::string opensslHmac(const std::string& key, const std::string& msg) {
  unsigned char out[32];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out, &len);
  return std::string(reinterpret_cast<const char*>(out), len);
}

std::string u32le(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

}  // namespace

TEST_CASE("K(a->b) is HMAC-SHA256 of the pair key, label and both ranks: the two ends agree, "
          "the two directions differ, and frames seal across derived keys only where asked",
          "[peer_seal]") {
  const std::string group = "smddp/test-group/";
  std::vector<X25519KeyPair> pairs;
  std::vector<std::string> pub;
  for (int r = 0; r < 3; ++r) {
    pairs.push_back(x25519KeyPair(rawKey(static_cast<uint8_t>(0x40 + r))));
    pub.push_back(pairs.back().publicKey);
  }
  std::vector<PeerKeys> keys;
  for (int r = 0; r < 3; ++r) {
    keys.push_back(PeerKeys::derive(r, pairs[r].privateKey, pub, group, ""));
  }
  // The derivation written out (design.md, "The peer wire's pair keys";
  // docs/notes/2026-12-02-peer-wire-encryption.md): pair key of 0 and 1,
  // then one key per direction.
  const std::string shared = opensslX25519(rawKey(0x40), pub[1]);
  const std::string pairKey = opensslHmac(
      shared, "smddp peer key v1" + group + u32le(0) + u32le(1) + pub[0] + pub[1]);
  const std::string k01 = opensslHmac(pairKey, "smddp wire encrypt v1" + u32le(0) + u32le(1));
  const std::string k10 = opensslHmac(pairKey, "smddp wire encrypt v1" + u32le(1) + u32le(0));
  CHECK(keys[0].directionKey(kWireEncryptLabel, 0, 1) == k01);
  CHECK(keys[1].directionKey(kWireEncryptLabel, 0, 1) == k01);
  CHECK(keys[1].directionKey(kWireEncryptLabel, 1, 0) == k10);
  CHECK(k01 != k10);
  CHECK(keys[0].directionKey(kWireEncryptLabel, 0, 2) != k01);

  // Ranks 0 and 1 on other hosts than each other; rank 2 on rank 0's host.
  PeerSeal at0 = PeerSeal::derive(keys[0], {false, true, false});
  PeerSeal at1 = PeerSeal::derive(keys[1], {true, false, true});
  CHECK(at0.seals(1));
  CHECK_FALSE(at0.seals(2));
  const auto plain = pattern(300, 1);
  std::vector<uint8_t> wire(300);
  SealTrailer t;
  const FrameHeader h = headerFor(0, 300);
  at0.seal(1, h, kWireTag, plain.data(), wire.data(), wire.size(), &t);
  uint8_t wantTag[16];
  CHECK(wire == opensslSeal(k01, h, t.counter, kWireTag, plain, wantTag));
  CHECK(std::memcmp(t.tag, wantTag, 16) == 0);
  // Only the pair's other end opens it: not rank 1 as if it came from 2.
  auto copy = wire;
  CHECK_FALSE(at1.open(2, h, kWireTag, t, copy.data(), copy.size()));
  REQUIRE(at1.open(0, h, kWireTag, t, wire.data(), wire.size()));
  CHECK(wire == plain);

  // Point-to-point scope: rank 2 shares rank 0's host, so the exchange
  // leaves their frames plain, but point-to-point seals them, and an
  // any-source receive at 0 opens a frame claiming rank 2 only if rank 2
  // sealed it. Rank 1 (another host) relabelling its frame as rank 2's, to
  // pass it off as plain traffic within the host, fails.
  PeerSeal at2 = PeerSeal::derive(keys[2], {false, true, false});
  CHECK(at0.seals(2, SealScope::kEveryPeer));
  CHECK(at2.seals(0, SealScope::kEveryPeer));
  CHECK_FALSE(at2.seals(0));
  CHECK_FALSE(at0.seals(0, SealScope::kEveryPeer));  // never itself
  const FrameHeader h2 = headerFor(2, 300);
  std::vector<uint8_t> near(300);
  SealTrailer t2;
  at2.seal(0, h2, kWireTag, plain.data(), near.data(), near.size(), &t2);
  CHECK(opensslSeal(keys[2].directionKey(kWireEncryptLabel, 2, 0), h2, t2.counter, kWireTag,
                    plain, wantTag) == near);
  std::vector<uint8_t> fromOne(300);
  SealTrailer t1;
  at1.seal(0, h2, kWireTag, plain.data(), fromOne.data(), fromOne.size(), &t1);
  CHECK_FALSE(at0.open(2, h2, kWireTag, t1, fromOne.data(), fromOne.size()));
  REQUIRE(at0.open(2, h2, kWireTag, t2, near.data(), near.size()));
  CHECK(near == plain);
  // A group all on one host seals nothing, in either scope.
  PeerSeal oneHost = PeerSeal::derive(keys[0], {false, false, false});
  CHECK_FALSE(oneHost.any());
  CHECK_FALSE(oneHost.seals(1, SealScope::kEveryPeer));
}
