// The peer wire's pair keys (transport/peer_keys.h) and the control
// frames they MAC (checkControlFrame in transport/frame.h): keys derived as
// the engine derives them, and each forgery a holder of the group's secret
// could try (a MAC of zeros or of another group, a flipped bit, a frame
// moved to another link or reflected) against its verdict.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/crypto.h"
#include "transport/frame.h"
#include "transport/peer_keys.h"

using namespace smddp;

namespace {

constexpr uint64_t kSecret = 0x0123456789abcdefULL;
constexpr uint64_t kSeq = 41;

CollectiveSignature allreduceSig() {
  return {CollectiveType::kAllreduce, DataType::kFloat32, ReduceOp::kSum, 1024, -1};
}

}  // namespace

namespace {

// Three ranks' pair keys, derived as the engine does.
std::vector<PeerKeys> threeRanks(const std::string& group) {
  std::vector<X25519KeyPair> pairs;
  std::vector<std::string> pub;
  for (int r = 0; r < 3; ++r) {
    pairs.push_back(x25519KeyPair());
    pub.push_back(pairs.back().publicKey);
  }
  std::vector<PeerKeys> out;
  for (int r = 0; r < 3; ++r) out.push_back(PeerKeys::derive(r, pairs[r].privateKey, pub, group, ""));
  return out;
}

// A control frame as it arrives: header and MAC, the text after them.
struct Arrived {
  ControlHead head{};
  std::string text;
  size_t received() const { return sizeof(ControlHead) + text.size(); }
};

Arrived sealed(const PeerKeys& keys, FrameHeader h, uint32_t to, std::string text) {
  Arrived a;
  a.head.header = h;
  a.text = std::move(text);
  const PeerMac m = controlFrameMac(keys, h, to, a.text);
  std::memcpy(a.head.mac, m.bytes, kPeerMacBytes);
  return a;
}

FrameVerdict check(const Arrived& a, const PeerKeys& at, std::string* why) {
  return checkControlFrame(a.head, a.text.data(), a.received(), kSecret, at, 4096, why);
}

}  // namespace

TEST_CASE("checkControlFrame: a frame MACed by its sender for this rank passes; forged, "
          "changed, reflected and cross-link ones are foreign",
          "[frame]") {
  const auto k = threeRanks("group A");
  std::string why;
  const FrameHeader err = makeHeader(FrameKind::kError, kSecret, kSeq, 1, 0, 1, 5, {});
  const FrameHeader probe = makeHeader(FrameKind::kProbe, kSecret, kSeq, 1, 0, 0, 0, allreduceSig());
  const Arrived good = sealed(k[1], err, 0, "boom!");
  CHECK(check(good, k[0], &why) == FrameVerdict::kOk);
  CHECK(check(sealed(k[1], probe, 0, ""), k[0], &why) == FrameVerdict::kOk);

  SECTION("the group's secret and the right layout, but a MAC of zeros or of another group") {
    Arrived forged = good;
    std::memset(forged.head.mac, 0, kPeerMacBytes);
    CHECK(check(forged, k[0], &why) == FrameVerdict::kForeign);
    CHECK(why.find("MAC") != std::string::npos);
    const auto other = threeRanks("group B");
    CHECK(check(sealed(other[1], err, 0, "boom!"), k[0], &why) == FrameVerdict::kForeign);
  }
  SECTION("any one bit flipped: header, sequence, MAC or text") {
    for (size_t bit = 0; bit < 8 * good.received(); bit += 7) {
      Arrived flipped = good;
      uint8_t* bytes = bit / 8 < sizeof(ControlHead)
                           ? reinterpret_cast<uint8_t*>(&flipped.head) + bit / 8
                           : reinterpret_cast<uint8_t*>(flipped.text.data()) +
                                 (bit / 8 - sizeof(ControlHead));
      *bytes ^= static_cast<uint8_t>(1u << (bit % 8));
      INFO("bit " << bit);
      CHECK(check(flipped, k[0], &why) != FrameVerdict::kOk);
    }
    Arrived later = good;
    later.head.header.seq += 1;
    CHECK(check(later, k[0], &why) == FrameVerdict::kForeign);
  }
  SECTION("a frame for rank 2 replayed to rank 0, or reflected back to its sender") {
    const Arrived toTwo = sealed(k[1], err, 2, "boom!");
    CHECK(check(toTwo, k[2], &why) == FrameVerdict::kOk);
    CHECK(check(toTwo, k[0], &why) == FrameVerdict::kForeign);  // another link
    CHECK(check(toTwo, k[1], &why) == FrameVerdict::kForeign);  // back to rank 1 itself
    // Claiming to come from rank 2 (to rank 1), with rank 1's MAC for rank 2.
    Arrived reflected = toTwo;
    reflected.head.header.srcRank = 2;
    CHECK(check(reflected, k[1], &why) == FrameVerdict::kForeign);
  }
  SECTION("layout still comes first, and a short frame never reaches the MAC") {
    Arrived lie = good;
    lie.head.header.length = 6;
    CHECK(check(lie, k[0], &why) == FrameVerdict::kMalformed);
    CHECK(checkControlFrame(good.head, good.text.data(), sizeof(ControlHead) - 1, kSecret, k[0],
                            4096, &why) == FrameVerdict::kMalformed);
    Arrived foreign = sealed(k[1], makeHeader(FrameKind::kError, kSecret ^ 1, kSeq, 1, 0, 1, 5, {}),
                             0, "boom!");
    CHECK(check(foreign, k[0], &why) == FrameVerdict::kForeign);  // another group's secret
  }
  SECTION("no key at all (a group that never derived one) refuses everything") {
    CHECK(check(good, PeerKeys(), &why) != FrameVerdict::kOk);
  }
}

TEST_CASE("pair keys: both ranks of a pair derive the same key, other pairs and groups differ; "
          "a key file mixed in changes them",
          "[frame]") {
  std::vector<X25519KeyPair> pairs;
  std::vector<std::string> pub;
  for (int r = 0; r < 3; ++r) {
    pairs.push_back(x25519KeyPair());
    pub.push_back(pairs.back().publicKey);
  }
  auto at = [&](int r, const std::string& group, const std::string& psk) {
    return PeerKeys::derive(r, pairs[r].privateKey, pub, group, psk);
  };
  const PeerKeys a0 = at(0, "g", ""), a1 = at(1, "g", ""), a2 = at(2, "g", "");
  const PeerMac m = a0.mac(0, 1, "hello");
  CHECK(a1.verify(0, "hello", {}, m.bytes));
  CHECK_FALSE(a2.verify(0, "hello", {}, m.bytes));               // another pair
  CHECK_FALSE(at(1, "h", "").verify(0, "hello", {}, m.bytes));   // another group
  CHECK_FALSE(at(1, "g", "key file").verify(0, "hello", {}, m.bytes));
  CHECK(at(1, "g", "key file").verify(0, "hello", {}, at(0, "g", "key file").mac(0, 1, "hello").bytes));
  // A store writer who swaps rank 1's public key for its own: rank 0 then
  // shares a key with the writer, not with rank 1.
  std::vector<std::string> swapped = pub;
  const X25519KeyPair writer = x25519KeyPair();
  swapped[1] = writer.publicKey;
  const PeerKeys fooled = PeerKeys::derive(0, pairs[0].privateKey, swapped, "g", "");
  CHECK_FALSE(a1.verify(0, "hello", {}, fooled.mac(0, 1, "hello").bytes));
  CHECK_THROWS_WITH(PeerKeys::derive(0, pairs[0].privateKey, {pub[0], "short", pub[2]}, "g", ""),
                    Catch::Contains("rank 1"));
}
