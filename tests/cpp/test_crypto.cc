// The cryptographic primitives (common/crypto.h) against published test
// vectors: HMAC-SHA256 from RFC 4231 and AES-256-GCM/GMAC from the GCM
// specification (McGrew and Viega, test cases 13-16), plus the failures
// that every consumer relies on: a changed byte, tag, nonce or AAD fails.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "common/crypto.h"

namespace {

std::vector<uint8_t> unhex(const std::string& h) {
  std::vector<uint8_t> out(h.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) out[i] = std::stoi(h.substr(2 * i, 2), nullptr, 16);
  return out;
}

std::string asKey(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

}  // namespace

using smddp::bytesOf;

TEST_CASE("HMAC-SHA256 matches RFC 4231, test case 2", "[crypto]") {
  const smddp::Mac m = smddp::hmacSha256("Jefe", {"what do ya want ", "for nothing?"});
  const auto want = unhex("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  CHECK(smddp::macEquals(m, want.data()));
}

TEST_CASE("AES-256-GMAC matches the GCM specification, test case 13", "[crypto]") {
  const std::string key(32, '\0');
  const uint8_t nonce[12] = {};
  const smddp::Tag t = smddp::aesGmac(key, nonce, {});
  CHECK(smddp::tagEquals(t, unhex("530f8afbc74536b9a963b4f1c4cb738b").data()));
}

TEST_CASE("AES-256-GCM seals and opens as the GCM specification's test case 16 says",
          "[crypto]") {
  const std::string key =
      asKey(unhex("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308"));
  const auto nonce = unhex("cafebabefacedbaddecaf888");
  const auto plain = unhex(
      "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72"
      "1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39");
  const auto aadBytes = unhex("feedfacedeadbeeffeedfacedeadbeefabaddad2");
  const std::string aad(aadBytes.begin(), aadBytes.end());
  const auto cipher = unhex(
      "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa"
      "8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662");
  const auto tag = unhex("76fc6ece0f4e1768cddf8853bb2d551b");

  std::vector<uint8_t> buf = plain;  // in place, as the wire seals
  const smddp::Tag t = smddp::aesGcmSeal(key, nonce.data(), aad, buf.data(), buf.data(), buf.size());
  CHECK(buf == cipher);
  CHECK(smddp::tagEquals(t, tag.data()));

  std::vector<uint8_t> out(buf.size());
  REQUIRE(smddp::aesGcmOpen(key, nonce.data(), aad, cipher.data(), out.data(), out.size(),
                            tag.data()));
  CHECK(out == plain);

  SECTION("a changed ciphertext byte fails") {
    auto bad = cipher;
    bad[17] ^= 1;
    CHECK_FALSE(smddp::aesGcmOpen(key, nonce.data(), aad, bad.data(), out.data(), out.size(),
                                  tag.data()));
  }
  SECTION("a changed tag fails") {
    auto badTag = tag;
    badTag[15] ^= 0x80;
    CHECK_FALSE(smddp::aesGcmOpen(key, nonce.data(), aad, cipher.data(), out.data(), out.size(),
                                  badTag.data()));
  }
  SECTION("another nonce fails") {
    auto otherNonce = nonce;
    otherNonce[0] ^= 1;
    CHECK_FALSE(smddp::aesGcmOpen(key, otherNonce.data(), aad, cipher.data(), out.data(),
                                  out.size(), tag.data()));
  }
  SECTION("other additional data fails") {
    CHECK_FALSE(smddp::aesGcmOpen(key, nonce.data(), aad.substr(1), cipher.data(), out.data(),
                                  out.size(), tag.data()));
  }
  SECTION("a truncated message fails") {
    CHECK_FALSE(smddp::aesGcmOpen(key, nonce.data(), aad, cipher.data(), out.data(),
                                  out.size() - 1, tag.data()));
  }
}

TEST_CASE("AES-256-GCM round-trips large buffers and keys of the wrong size are refused",
          "[crypto]") {
  const std::string key = smddp::randomHex(16);  // 32 bytes
  uint8_t nonce[12];
  smddp::randomBytes(nonce, sizeof(nonce));
  std::vector<uint8_t> plain(3 << 20);
  for (size_t i = 0; i < plain.size(); ++i) plain[i] = static_cast<uint8_t>(i * 7 + 3);
  std::vector<uint8_t> buf = plain;
  const smddp::Tag t = smddp::aesGcmSeal(key, nonce, "hdr", buf.data(), buf.data(), buf.size());
  CHECK(buf != plain);
  REQUIRE(smddp::aesGcmOpen(key, nonce, "hdr", buf.data(), buf.data(), buf.size(), t.bytes));
  CHECK(buf == plain);
  CHECK_THROWS_WITH(smddp::aesGcmSeal("short", nonce, "", buf.data(), buf.data(), 1),
                    Catch::Contains("32 bytes"));
}

TEST_CASE("X25519 matches RFC 7748, section 6.1: both key pairs and the shared secret",
          "[crypto]") {
  const auto a = smddp::x25519KeyPair(
      asKey(unhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")));
  const auto b = smddp::x25519KeyPair(
      asKey(unhex("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb")));
  CHECK(a.publicKey ==
        asKey(unhex("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a")));
  CHECK(b.publicKey ==
        asKey(unhex("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")));
  const std::string k =
      asKey(unhex("4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742"));
  CHECK(smddp::x25519SharedSecret(a.privateKey, b.publicKey, "bob") == k);
  CHECK(smddp::x25519SharedSecret(b.privateKey, a.publicKey, "alice") == k);
}

TEST_CASE("X25519: fresh pairs agree, and bad public keys are refused by name", "[crypto]") {
  const auto a = smddp::x25519KeyPair();
  const auto b = smddp::x25519KeyPair();
  CHECK(a.publicKey != b.publicKey);
  CHECK(smddp::x25519SharedSecret(a.privateKey, b.publicKey, "b") ==
        smddp::x25519SharedSecret(b.privateKey, a.publicKey, "a"));
  CHECK_THROWS_WITH(smddp::x25519SharedSecret(a.privateKey, "short", "rank 3"),
                    Catch::Contains("rank 3") && Catch::Contains("32"));
  // The all-zero point has low order: the shared secret would be zero.
  CHECK_THROWS_WITH(smddp::x25519SharedSecret(a.privateKey, std::string(32, '\0'), "rank 4"),
                    Catch::Contains("rank 4"));
}
