// The standalone reduction servers' wire and plans (server/server_wire.h,
// server_link.h; docs/design.md, "Standalone reduction servers"), with no
// server running: the header codec, the frame reader and writer over a
// socket pair in any split, the SMDDP_SERVER_HOSTS parser against
// hand-made inputs, the H + K piece split as a partition, and the group's
// verdict on its servers from hand-made reports (closed forms).
#include <catch2/catch.hpp>

#include <openssl/evp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/crypto.h"
#include "common/error.h"
#include "server/server_auth.h"
#include "server/server_link.h"
#include "server/server_wire.h"
#include "server_test_frames.h"

using namespace smddp;
using Clock = std::chrono::steady_clock;

TEST_CASE("server frames: well-formed ones pass, each bad field is named", "[server]") {
  ServerFrame f = dataFrame(100);
  CHECK(validateServerFrame(f, {ServerFrameKind::kData}).empty());
  CHECK_THAT(validateServerFrame(f, {ServerFrameKind::kResult}),
             Catch::Contains("data frame") && Catch::Contains("result"));
  ServerFrame g = f;
  g.magic = 0x12345678;
  CHECK_THAT(validateServerFrame(g, {ServerFrameKind::kData}), Catch::Contains("magic"));
  g = f;
  g.version = 9;
  CHECK_THAT(validateServerFrame(g, {ServerFrameKind::kData}), Catch::Contains("version 9"));
  g = f;
  g.dtype = 200;
  CHECK_THAT(validateServerFrame(g, {ServerFrameKind::kData}), Catch::Contains("dtype 200"));
  g = f;
  g.op = static_cast<uint8_t>(ReduceOp::kBxor);  // bitwise op on float32
  CHECK_FALSE(validateServerFrame(g, {ServerFrameKind::kData}).empty());
  g = f;
  g.payload = 401;  // not count * 4
  CHECK_THAT(validateServerFrame(g, {ServerFrameKind::kData}), Catch::Contains("401 bytes"));
  g = f;
  g.count = (1ull << 62) + 100;  // count * 4 would wrap to 400
  CHECK_FALSE(validateServerFrame(g, {ServerFrameKind::kData}).empty());
  g = f;
  g.payload = g.count = kServerMaxPayload + 1;
  g.dtype = static_cast<uint8_t>(DataType::kUInt8);
  CHECK_THAT(validateServerFrame(g, {ServerFrameKind::kData}), Catch::Contains("at most"));
  g = f;
  g.divisor = 0;
  CHECK_THAT(validateServerFrame(g, {ServerFrameKind::kData}), Catch::Contains("divisor"));
  // The narrow wire form: bf16 or fp16 elements after a 4-byte scale.
  for (DataType wire : {DataType::kBFloat16, DataType::kFloat16}) {
    g = dataFrame(100, wire);
    g.flags = kServerFlagNarrowWire;
    g.payload = 4 + 200;
    CHECK(validateServerFrame(g, {ServerFrameKind::kData, ServerFrameKind::kResult}).empty());
    g.payload = 200;  // the scale missing
    CHECK_THAT(validateServerFrame(g, {ServerFrameKind::kData}),
               Catch::Contains("200 bytes") && Catch::Contains("narrow wire form"));
    g.payload = 3;
    CHECK_FALSE(validateServerFrame(g, {ServerFrameKind::kData}).empty());
    g.count = 0;
    g.payload = 4;
    CHECK(validateServerFrame(g, {ServerFrameKind::kData}).empty());
  }
  g = f;  // float32 has no narrow form
  g.flags = kServerFlagNarrowWire;
  CHECK_THAT(validateServerFrame(g, {ServerFrameKind::kData}),
             Catch::Contains("narrow wire form of float32"));
  g = f;
  g.flags = kServerFlagIntegrity;  // a hello's flag
  CHECK_THAT(validateServerFrame(g, {ServerFrameKind::kData}), Catch::Contains("unknown flags 1"));
  ServerFrame hello;
  hello.kind = static_cast<uint8_t>(ServerFrameKind::kHello);
  hello.hosts = 2;
  hello.host = 2;
  hello.payload = kServerProofBytes;
  CHECK_THAT(validateServerFrame(hello, {ServerFrameKind::kHello}), Catch::Contains("host 2 of 2"));
  hello.host = 1;
  CHECK(validateServerFrame(hello, {ServerFrameKind::kHello}).empty());
  // A hello carries its proof and a job id of at most 256 bytes, pieces of
  // at most 256 MiB, and no flags but integrity and encryption.
  ServerFrame g2 = hello;
  g2.payload = kServerProofBytes - 1;
  CHECK_THAT(validateServerFrame(g2, {ServerFrameKind::kHello}), Catch::Contains("a hello of 31"));
  g2.payload = kServerProofBytes + kServerMaxJob + 1;
  CHECK_FALSE(validateServerFrame(g2, {ServerFrameKind::kHello}).empty());
  g2 = hello;
  g2.count = kServerMaxPayload + 1;
  CHECK_THAT(validateServerFrame(g2, {ServerFrameKind::kHello}), Catch::Contains("pieces of up"));
  g2 = hello;
  g2.flags = 2;
  CHECK_THAT(validateServerFrame(g2, {ServerFrameKind::kHello}), Catch::Contains("unknown flags"));
  g2.flags = kServerFlagIntegrity;
  CHECK(validateServerFrame(g2, {ServerFrameKind::kHello}).empty());
  // Encryption (SMDDP_WIRE_ENCRYPT) comes with integrity, never alone.
  g2.flags = kServerFlagIntegrity | kServerFlagEncrypt;
  CHECK(validateServerFrame(g2, {ServerFrameKind::kHello}).empty());
  g2.flags = kServerFlagEncrypt;
  CHECK_THAT(validateServerFrame(g2, {ServerFrameKind::kHello}),
             Catch::Contains("encryption without integrity"));
  // A challenge is a nonce, a key share, an address of 1 to 64 bytes
  // (count) and a job id of at most 256; an answer a nonce, a share and a
  // proof: a header announcing more is refused before a byte of it is read.
  ServerFrame ch;
  ch.kind = static_cast<uint8_t>(ServerFrameKind::kChallenge);
  ch.count = 15;  // "127.0.0.1:29500"
  ch.payload = 64 + 15;
  CHECK(validateServerFrame(ch, {ServerFrameKind::kChallenge}).empty());
  ch.payload = 64 + 15 + 256;
  CHECK(validateServerFrame(ch, {ServerFrameKind::kChallenge}).empty());
  ch.payload = 64 + 15 + 257;
  CHECK_THAT(validateServerFrame(ch, {ServerFrameKind::kChallenge}),
             Catch::Contains("challenge of 336 bytes"));
  ch.payload = 64 + 14;  // shorter than its address
  CHECK_FALSE(validateServerFrame(ch, {ServerFrameKind::kChallenge}).empty());
  ch.count = 0;  // no address
  ch.payload = 64;
  CHECK_FALSE(validateServerFrame(ch, {ServerFrameKind::kChallenge}).empty());
  ch.count = 65;
  ch.payload = 64 + 65;
  CHECK_FALSE(validateServerFrame(ch, {ServerFrameKind::kChallenge}).empty());
  ch.count = 15;
  ch.payload = 256ull << 20;
  CHECK_THAT(validateServerFrame(ch, {ServerFrameKind::kChallenge}),
             Catch::Contains("challenge of 268435456 bytes"));
  ch.kind = static_cast<uint8_t>(ServerFrameKind::kAnswer);
  ch.payload = 96;
  CHECK(validateServerFrame(ch, {ServerFrameKind::kAnswer}).empty());
  ch.payload = 64;  // a version 4 answer: no share
  CHECK_FALSE(validateServerFrame(ch, {ServerFrameKind::kAnswer}).empty());
  ServerFrame bye;
  bye.kind = static_cast<uint8_t>(ServerFrameKind::kBye);
  CHECK(validateServerFrame(bye, {ServerFrameKind::kBye}).empty());
  bye.payload = 8;
  CHECK_THAT(validateServerFrame(bye, {ServerFrameKind::kBye}),
             Catch::Contains("bye frame with 8 bytes"));
  ServerFrame a = dataFrame(10), b = dataFrame(10);
  b.step = 3;
  CHECK(samePiece(a, a).empty());
  CHECK_THAT(samePiece(a, b), Catch::Contains("step 3"));
  ServerFrame n = a;
  n.flags = kServerFlagNarrowWire;
  CHECK_THAT(samePiece(a, n), Catch::Contains("narrow"));
}

TEST_CASE("FrameWriter and FrameReader carry frames through a socket in any split", "[server]") {
  // A stream socket with small buffers: each frame crosses in many
  // partial sends and reads, and the two ends take turns on one thread.
  int sv[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) == 0);
  const int small = 4096;
  setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
  setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  // The oracle: the frames as queued. Payloads of 0 to 300,000 bytes,
  // each byte a function of its frame and offset.
  std::vector<ServerFrame> sent;
  std::vector<std::vector<uint8_t>> payloads;
  uint64_t total = 0;
  for (uint64_t i = 0; i < 60; ++i) {
    const uint64_t n = i % 7 == 0 ? 0 : (i * 7919 * 13) % 300000;
    ServerFrame f = dataFrame(n, DataType::kUInt8);
    f.step = i;
    std::vector<uint8_t> p(n);
    for (uint64_t j = 0; j < n; ++j) p[j] = static_cast<uint8_t>(i * 31 + j * 7);
    sent.push_back(f);
    payloads.push_back(std::move(p));
    total += sizeof(ServerFrame) + n;
  }
  FrameWriter w;
  for (size_t i = 0; i < sent.size(); ++i) w.push(sent[i], payloads[i].data());
  FrameReader r;
  std::vector<uint8_t> into;
  size_t done = 0, headers = 0;
  std::string why;
  for (int turn = 0; done < sent.size() && turn < 1000000; ++turn) {
    while (!w.empty()) {
      const FrameIo io = w.write(sv[0], &why);
      REQUIRE(io != FrameIo::kFailed);
      if (io != FrameIo::kDone) break;
      w.pop();
    }
    while (done < sent.size()) {
      const FrameIo io = r.read(sv[1], &why);
      REQUIRE(io != FrameIo::kFailed);
      if (io == FrameIo::kAgain) break;
      if (io == FrameIo::kHeader) {
        ++headers;
        REQUIRE(std::memcmp(&r.header(), &sent[done], sizeof(ServerFrame)) == 0);
        into.assign(r.header().payload, 0xEE);
        r.payloadTo(into.data());
        continue;
      }
      REQUIRE(into == payloads[done]);  // kDone
      r.next();
      ++done;
    }
  }
  CHECK(done == sent.size());
  CHECK(headers == sent.size());
  CHECK(w.empty());
  CHECK(w.bytes() == total);
  CHECK(r.bytes() == total);
  CHECK(r.idle());
  // A frame half sent: finishBefore completes it, so the next frame (an
  // error, say) starts on a boundary.
  std::vector<uint8_t> big(4 << 20, 5);
  ServerFrame f = dataFrame(big.size(), DataType::kUInt8);
  w.push(f, big.data());
  REQUIRE(w.write(sv[0], &why) == FrameIo::kAgain);  // the buffer filled mid-frame
  std::thread drain([&] {
    std::vector<uint8_t> sink(sizeof(ServerFrame) + big.size());
    size_t got = 0;
    const auto until = Clock::now() + std::chrono::seconds(10);
    while (got < sink.size() && Clock::now() < until) {
      ssize_t k = recv(sv[1], sink.data() + got, sink.size() - got, 0);
      if (k > 0) got += static_cast<size_t>(k);
      else std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    CHECK(got == sink.size());
    CHECK(std::equal(big.begin(), big.end(), sink.begin() + sizeof(ServerFrame)));
  });
  CHECK(w.finishBefore(sv[0], Clock::now() + std::chrono::seconds(10)).empty());
  drain.join();
  CHECK(w.empty());
  // The peer goes away: the reader says "closed" mid-frame, the writer
  // names the socket's error.
  REQUIRE(send(sv[0], &f, 10, 0) == 10);  // a header cut short
  close(sv[0]);
  FrameIo io = FrameIo::kAgain;
  for (int i = 0; i < 10000 && io == FrameIo::kAgain; ++i) {
    io = r.read(sv[1], &why);
    if (io == FrameIo::kAgain) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(io == FrameIo::kFailed);
  CHECK(why == "closed");
  w.push(f, big.data());
  CHECK(w.write(sv[1], &why) == FrameIo::kFailed);
  CHECK_THAT(why, Catch::Contains("pipe") || Catch::Contains("reset"));
  close(sv[1]);
}

TEST_CASE("sealed frames cross in any split, and any altered, dropped or replayed one fails",
          "[server]") {
  int sv[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) == 0);
  const int small = 4096;
  setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
  const std::string session(32, 'k');
  FrameSeal seal(session, SealDirection::kToWorker), check(session, SealDirection::kToWorker);
  FrameWriter w;
  w.sealWith(&seal);
  FrameReader r;
  r.checkWith(&check);
  std::vector<std::vector<uint8_t>> payloads;
  for (uint64_t i = 0; i < 20; ++i) {
    payloads.emplace_back(i * 5000, static_cast<uint8_t>(i));
  }
  for (uint64_t i = 0; i < payloads.size(); ++i) {
    ServerFrame f = dataFrame(payloads[i].size(), DataType::kUInt8);
    f.step = i;
    w.push(f, payloads[i].data());
  }
  std::string why;
  std::vector<uint8_t> into;
  size_t done = 0;
  for (int turn = 0; done < payloads.size() && turn < 1000000; ++turn) {
    while (!w.empty()) {
      const FrameIo io = w.write(sv[0], &why);
      REQUIRE(io != FrameIo::kFailed);
      if (io != FrameIo::kDone) break;
      w.pop();
    }
    while (done < payloads.size()) {
      const FrameIo io = r.read(sv[1], &why);
      REQUIRE(io != FrameIo::kFailed);
      if (io == FrameIo::kAgain) break;
      if (io == FrameIo::kHeader) {
        into.assign(r.header().payload, 0);
        r.payloadTo(into.data());
        continue;
      }
      REQUIRE(into == std::vector<uint8_t>(payloads[done].begin(), payloads[done].end()));
      r.next();
      ++done;
    }
  }
  CHECK(done == payloads.size());
  // What went over the wire for one frame: header, payload, then the
  // AES-256-GMAC of header and payload under the session key, its nonce
  // direction 'S', three zero bytes and the counter (little-endian) -
  // computed here through OpenSSL's GCM directly, not through FrameSeal.
  ServerFrame f = dataFrame(3, DataType::kUInt8);
  const uint8_t body[3] = {7, 8, 9};
  FrameSeal fresh(session, SealDirection::kToWorker);
  FrameWriter one;
  one.sealWith(&fresh);
  one.push(f, body);
  REQUIRE(one.write(sv[0], &why) == FrameIo::kDone);
  uint8_t wire[64 + 3 + 16];
  REQUIRE(recv(sv[1], wire, sizeof(wire), MSG_WAITALL) == sizeof(wire));
  const uint8_t iv[12] = {'S', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  uint8_t want[16];
  EVP_CIPHER_CTX* gcm = EVP_CIPHER_CTX_new();
  int n = 0;
  REQUIRE(EVP_EncryptInit_ex(gcm, EVP_aes_256_gcm(), nullptr,
                             reinterpret_cast<const unsigned char*>(session.data()), iv) == 1);
  REQUIRE(EVP_EncryptUpdate(gcm, nullptr, &n, reinterpret_cast<const unsigned char*>(&f),
                            sizeof(f)) == 1);
  REQUIRE(EVP_EncryptUpdate(gcm, nullptr, &n, body, 3) == 1);
  REQUIRE(EVP_EncryptFinal_ex(gcm, nullptr, &n) == 1);
  REQUIRE(EVP_CIPHER_CTX_ctrl(gcm, EVP_CTRL_GCM_GET_TAG, 16, want) == 1);
  EVP_CIPHER_CTX_free(gcm);
  CHECK(std::memcmp(want, wire + 67, 16) == 0);
  // A reader expecting frame 0 sees the same bytes with one bit changed
  // anywhere, or frame 0 again after it (a replay): each fails the check.
  for (size_t flip : {0ul, 40ul, 64ul, 66ul, 67ul, 82ul}) {
    INFO("flipped byte " << flip);
    uint8_t bad[sizeof(wire)];
    std::memcpy(bad, wire, sizeof(wire));
    bad[flip] ^= 1;
    FrameSeal c(session, SealDirection::kToWorker);
    FrameReader rr;
    rr.checkWith(&c);
    REQUIRE(send(sv[0], bad, sizeof(bad), 0) == sizeof(bad));
    FrameIo io = rr.read(sv[1], &why);
    if (io == FrameIo::kHeader) {  // (no flipped byte is in the length field)
      into.assign(rr.header().payload, 0);
      rr.payloadTo(into.data());
      io = rr.read(sv[1], &why);
    }
    CHECK(io == FrameIo::kFailed);
    CHECK_THAT(why, Catch::Contains("integrity check"));
    char sink[256];
    while (recv(sv[1], sink, sizeof(sink), MSG_DONTWAIT) > 0) {
    }
  }
  FrameSeal c2(session, SealDirection::kToWorker);
  FrameReader replay;
  replay.checkWith(&c2);
  for (int copy = 0; copy < 2; ++copy) {
    REQUIRE(send(sv[0], wire, sizeof(wire), 0) == sizeof(wire));
    REQUIRE(replay.read(sv[1], &why) == FrameIo::kHeader);
    into.assign(3, 0);
    replay.payloadTo(into.data());
    const FrameIo io = replay.read(sv[1], &why);
    CHECK(io == (copy == 0 ? FrameIo::kDone : FrameIo::kFailed));
    replay.next();
  }
  close(sv[0]);
  close(sv[1]);
}

TEST_CASE("SMDDP_SERVER_HOSTS parses lists and names itself in every error", "[server]") {
  CHECK(parseServerHosts("").empty());
  CHECK(parseServerHosts("  ").empty());
  auto v = parseServerHosts("10.0.0.1:29500, h2:80,[::1]:7");
  REQUIRE(v.size() == 3);
  CHECK(v[0].host == "10.0.0.1");
  CHECK(v[0].port == 29500);
  CHECK(v[1].host == "h2");
  CHECK(v[2].host == "::1");
  CHECK(v[2].port == 7);
  CHECK(v[1].origin == "SMDDP_SERVER_HOSTS[1]");
  for (const char* bad : {"h1", "h1:", "h1:0", "h1:70000", "h1:x", ":80", "h1:80,,h2:80", "::1:80",
                          "h1:80,"}) {
    INFO(bad);
    try {
      parseServerHosts(bad);
      FAIL("accepted");
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::kInvalidArgument);
      CHECK_THAT(e.what(), Catch::Contains("SMDDP_SERVER_HOSTS"));
    }
  }
}

TEST_CASE("the H + K pieces partition every step", "[server]") {
  for (uint64_t len : {0ull, 1ull, 5ull, 1000ull, 32768ull, 32771ull}) {
    for (int H : {2, 3, 4}) {
      for (int K : {0, 1, 2, 5}) {
        for (int percent : {-1, 0, 33, 100}) {
          const uint64_t share = serverShareMillionths(H, K, percent);
          for (uint64_t step : {0ull, 1ull, 7ull}) {
            uint64_t next = 0, onServers = 0;
            for (int i = 0; i < H + K; ++i) {
              Range r = crossHostPiece(len, H, K, i, step, share);
              CHECK(r.offset == next);
              next = r.offset + r.count;
              if (i >= H) onServers += r.count;
            }
            CHECK(next == len);
            CHECK(onServers == (K ? len * share / 1000000 : 0));
          }
        }
      }
    }
  }
  // Balanced for one link speed: 4 hosts, 2 servers: b = 6S/20 each, so
  // a worker sends S + 2a = 1.2 S and a server 4b = 1.2 S.
  CHECK(serverShareMillionths(4, 2, -1) == 600000);
  CHECK(serverShareMillionths(2, 1, -1) == 500000);
  CHECK(serverShareMillionths(2, 4, -1) == 1000000);  // capped: everything to the servers
  CHECK(serverShareMillionths(4, 0, -1) == 0);
  CHECK(serverShareMillionths(4, 2, 33) == 330000);
}

TEST_CASE("the group's verdict on its servers is the same from every rank's reports", "[server]") {
  const std::string refused = "standalone reduction server 0 (h:1, SMDDP_SERVER_HOSTS[0]): cannot "
                              "connect: Connection refused";
  const std::string ok2 = reachStatus("", {"", ""}, 2);
  const std::string miss0 = reachStatus("", {refused, ""}, 2);
  const std::string none = reachStatus("", {}, 2);  // a rank that serves no stream
  SECTION("every server reached") {
    const auto v = agreeOnServers({ok2, none, ok2}, 2, false);
    CHECK(v.error.empty());
    CHECK(v.inUse() == 2);
  }
  SECTION("one rank misses a server: every rank leaves it out, naming who missed it") {
    const auto v = agreeOnServers({ok2, none, miss0, ok2}, 2, false);
    CHECK(v.error.empty());
    CHECK(v.live == std::vector<bool>{false, true});
    CHECK(v.why[0] == "rank 2: " + refused);
    CHECK(v.why[1].empty());
    const auto both = agreeOnServers({miss0, miss0}, 2, false);
    CHECK(both.why[0] == "rank 0: " + refused + "; rank 1: " + refused);
  }
  SECTION("SMDDP_SERVER_REQUIRED makes a missed server the group's error") {
    const auto v = agreeOnServers({ok2, miss0}, 2, true);
    CHECK_THAT(v.error, Catch::Contains("rank 1: " + refused) &&
                            Catch::Contains("SMDDP_SERVER_REQUIRED=1"));
    CHECK(agreeOnServers({ok2, ok2}, 2, true).error.empty());
  }
  SECTION("a rank's set-up error is every rank's, ahead of any miss") {
    const auto v = agreeOnServers({miss0, reachStatus("another job\nsecond line", {}, 2)}, 2,
                                  false);
    CHECK(v.error == "smddp: rank 1 cannot use the standalone reduction servers "
                     "(SMDDP_SERVER_HOSTS): another job second line");
  }
  SECTION("a report of another length is an error, not a guess") {
    CHECK_THAT(agreeOnServers({ok2, reachStatus("", {}, 3)}, 2, false).error,
               Catch::Contains("rank 1") && Catch::Contains("malformed"));
    CHECK_THAT(agreeOnServers({"bogus\n\n"}, 2, false).error, Catch::Contains("malformed"));
  }
  SECTION("a reason with a line break stays one line") {
    const auto v = agreeOnServers({reachStatus("", {"a\nb", ""}, 2)}, 2, false);
    CHECK(v.why[0] == "rank 0: a b");
  }
}
