// Encrypted standalone-server frames (SMDDP_WIRE_ENCRYPT; server/
// server_wire.h FrameSeal): what crosses the wire is OpenSSL's AES-256-GCM
// of each payload, computed here directly, and any altered, dropped,
// replayed, reordered or reflected frame fails, in both directions.
#include <catch2/catch.hpp>

#include <openssl/evp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/crypto.h"
#include "server/server_wire.h"
#include "server_test_frames.h"

using namespace smddp;
namespace {

// The bytes `frames` (with `payloads`) take on the wire under `seal`: a
// writer sends them through a socket pair in whatever pieces its small
// buffer takes, and a tap records every byte.
std::string wireBytes(FrameSeal& seal, const std::vector<ServerFrame>& frames,
                      const std::vector<std::vector<uint8_t>>& payloads) {
  int sv[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) == 0);
  const int small = 4096;
  setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
  FrameWriter w;
  w.sealWith(&seal);
  for (size_t i = 0; i < frames.size(); ++i) w.push(frames[i], payloads[i].data());
  std::string wire, why;
  char buf[3000];  // the tap reads in pieces that split frames anywhere
  for (int turn = 0; !w.empty() && turn < 1000000; ++turn) {
    const FrameIo io = w.write(sv[0], &why);
    REQUIRE(io != FrameIo::kFailed);
    if (io == FrameIo::kDone) w.pop();
    for (ssize_t k; (k = recv(sv[1], buf, sizeof(buf), MSG_DONTWAIT)) > 0;) wire.append(buf, k);
  }
  for (ssize_t k; (k = recv(sv[1], buf, sizeof(buf), MSG_DONTWAIT)) > 0;) wire.append(buf, k);
  close(sv[0]);
  close(sv[1]);
  return wire;
}

// Feeds `wire` to a reader checking with `check`, in pieces of 1 to 7919
// bytes; the payloads of the frames it accepts, and in `why` the failure
// that stopped it ("" if none).
std::vector<std::vector<uint8_t>> readWire(FrameSeal& check, const std::string& wire,
                                           std::string* why) {
  int sv[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) == 0);
  FrameReader r;
  r.checkWith(&check);
  std::vector<std::vector<uint8_t>> got;
  std::vector<uint8_t> into;
  why->clear();
  size_t at = 0;
  for (size_t piece = 1; at < wire.size() && why->empty(); piece = piece * 31 % 7919 + 1) {
    const ssize_t k = send(sv[0], wire.data() + at, std::min(piece, wire.size() - at), 0);
    REQUIRE(k > 0);
    at += static_cast<size_t>(k);
    while (why->empty()) {
      const FrameIo io = r.read(sv[1], why);
      if (io == FrameIo::kAgain || io == FrameIo::kFailed) break;
      if (io == FrameIo::kHeader) {
        into.assign(r.header().payload, 0);
        r.payloadTo(into.data());
        continue;
      }
      got.push_back(into);
      r.next();
    }
  }
  close(sv[0]);
  close(sv[1]);
  return got;
}

}  // namespace

TEST_CASE("encrypted frames (SMDDP_WIRE_ENCRYPT) cross in any split as ciphertext, and any "
          "altered, dropped, replayed, reordered or reflected one fails, in both directions",
          "[server][encrypt]") {
  const std::string session(32, 'k');
  const std::string pattern = "GRADIENT-PLAINTEXT-PATTERN/";
  std::vector<ServerFrame> frames;
  std::vector<std::vector<uint8_t>> payloads;
  for (uint64_t i = 0; i < 12; ++i) {  // 0 to 110,000 bytes, the pattern over and over
    std::vector<uint8_t> p(i * 10000);
    for (size_t j = 0; j < p.size(); ++j) p[j] = static_cast<uint8_t>(pattern[j % pattern.size()]);
    ServerFrame f = dataFrame(p.size(), DataType::kUInt8);
    f.step = i;
    frames.push_back(f);
    payloads.push_back(std::move(p));
  }
  const auto before = payloads;
  FrameSeal seal(session, SealDirection::kToServer, /*encrypt=*/true);
  const std::string wire = wireBytes(seal, frames, payloads);
  // The writer's memory is left as it was; no run of the plaintext is on
  // the wire (only headers and ciphertext), while a MAC-only wire shows it.
  CHECK(payloads == before);
  CHECK(wire.find(pattern.substr(0, 12)) == std::string::npos);
  FrameSeal macOnly(session, SealDirection::kToServer);
  CHECK(wireBytes(macOnly, frames, payloads).find(pattern) != std::string::npos);
  std::string why;
  FrameSeal check(session, SealDirection::kToServer, true);
  CHECK(readWire(check, wire, &why) == payloads);
  CHECK(why.empty());
  // Frame 0 (no payload) and frame 1 as they are on the wire; frame 1 is
  // AES-256-GCM of its payload, the header as additional data, under the
  // session key and the nonce 'W', three zero bytes, counter 1 - computed
  // here through OpenSSL directly, not through FrameSeal.
  const size_t len0 = 64 + 16, len1 = 64 + 10000 + 16;
  REQUIRE(wire.size() > len0 + len1);
  const std::string f0 = wire.substr(0, len0), f1 = wire.substr(len0, len1);
  const uint8_t iv[12] = {'W', 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0};
  std::vector<uint8_t> cipher(10000);
  uint8_t tag[16];
  EVP_CIPHER_CTX* gcm = EVP_CIPHER_CTX_new();
  int n = 0;
  REQUIRE(EVP_EncryptInit_ex(gcm, EVP_aes_256_gcm(), nullptr,
                             reinterpret_cast<const unsigned char*>(session.data()), iv) == 1);
  REQUIRE(EVP_EncryptUpdate(gcm, nullptr, &n, reinterpret_cast<const unsigned char*>(&frames[1]),
                            64) == 1);
  REQUIRE(EVP_EncryptUpdate(gcm, cipher.data(), &n, payloads[1].data(), 10000) == 1);
  REQUIRE(EVP_EncryptFinal_ex(gcm, nullptr, &n) == 1);
  REQUIRE(EVP_CIPHER_CTX_ctrl(gcm, EVP_CTRL_GCM_GET_TAG, 16, tag) == 1);
  EVP_CIPHER_CTX_free(gcm);
  CHECK(std::memcmp(f1.data(), &frames[1], 64) == 0);  // the header goes in clear
  CHECK(std::memcmp(f1.data() + 64, cipher.data(), cipher.size()) == 0);
  CHECK(std::memcmp(f1.data() + 64 + 10000, tag, 16) == 0);
  // Each of these fails the check at the frame it changes, naming the
  // setting; the frames before it are accepted.
  auto fails = [&](const std::string& bytes, size_t accepted, SealDirection dir) {
    FrameSeal c(session, dir, true);
    const auto got = readWire(c, bytes, &why);
    CHECK(got.size() == accepted);
    CHECK_THAT(why, Catch::Contains("integrity check") && Catch::Contains("SMDDP_WIRE_ENCRYPT"));
  };
  for (size_t flip : {0ul, 40ul, 64ul, 5000ul, 64ul + 9999, 64ul + 10000, len1 - 1}) {
    INFO("flipped byte " << flip << " of frame 1");
    std::string bad = f1;  // (none in the length field, bytes 48 to 55)
    bad[flip] ^= 1;
    fails(f0 + bad, 1, SealDirection::kToServer);
  }
  fails(f1, 0, SealDirection::kToServer);                 // frame 0 dropped
  fails(f0 + f0, 1, SealDirection::kToServer);            // frame 0 replayed
  fails(f1 + f0, 0, SealDirection::kToServer);            // frames 0 and 1 reordered
  fails(f0 + f1, 0, SealDirection::kToWorker);            // reflected back to its sender
  // The same towards the worker: the server's results, sealed with the
  // other direction's nonce.
  FrameSeal toWorker(session, SealDirection::kToWorker, /*encrypt=*/true);
  const std::string back = wireBytes(toWorker, frames, payloads);
  REQUIRE(back.size() > len0 + len1);
  const std::string b0 = back.substr(0, len0), b1 = back.substr(len0, len1);
  CHECK(b1.substr(64, 10000) != f1.substr(64, 10000));  // another nonce, another ciphertext
  {
    FrameSeal c(session, SealDirection::kToWorker, true);
    CHECK(readWire(c, b0 + b1, &why).size() == 2);
  }
  std::string badResult = b1;
  badResult[64 + 5000] ^= 1;
  fails(b0 + badResult, 1, SealDirection::kToWorker);   // a result altered
  fails(b1, 0, SealDirection::kToWorker);                 // result 0 dropped
  fails(b0 + b0, 1, SealDirection::kToWorker);            // result 0 replayed
  fails(b1 + b0, 0, SealDirection::kToWorker);            // results 0 and 1 reordered
  fails(b0 + b1, 0, SealDirection::kToServer);            // reflected back to the server
  // Another connection's key (another handshake) opens nothing.
  FrameSeal other(std::string(32, 'j'), SealDirection::kToServer, true);
  CHECK(readWire(other, f0 + f1, &why).empty());
  CHECK_THAT(why, Catch::Contains("SMDDP_WIRE_ENCRYPT"));
}
