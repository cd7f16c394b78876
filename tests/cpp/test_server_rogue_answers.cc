// What a worker's links (server/server_link.h) do with what a hostile
// server sends them: a sealed result whose tag fails never reaches the
// caller's memory, and an error text from a server that never proved the
// key reaches the log cut short, printable, and marked unauthenticated.
// The server here is a test's own socket; torch-free, on loopback.
#include <catch2/catch.hpp>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <vector>

#include "server/server_handshake.h"
#include "server/server_link.h"
#include "server_test_frames.h"
#include "transport/socket_address.h"

using namespace smddp;
using Clock = std::chrono::steady_clock;

namespace {

// Accepts one connection on `listener` within 10 s (-1 if none came).
int acceptOne(int listener) {
  pollfd p{listener, POLLIN, 0};
  if (poll(&p, 1, 10000) <= 0) return -1;
  return accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
}

std::vector<ServerAddress> at(int port) { return {{"127.0.0.1", port, "SMDDP_SERVER_HOSTS[0]"}}; }

}  // namespace

TEST_CASE("a sealed result whose tag fails never lands in its slot", "[server][security]") {
  int port = 0;
  UniqueFd listener = listenOn("127.0.0.1", 0, &port, "test server", 4);
  // A server that holds the key and proves itself, then answers the
  // worker's piece with a result sealed over the right bytes and altered
  // after sealing (one float), as a bit flip or a tamperer on the path.
  auto server = std::async(std::launch::async, [&]() -> std::string {
    const int fd = acceptOne(listener.get());
    if (fd < 0) return "no connection";
    std::atomic<int64_t> open{0};
    ServerIdentity id;
    id.key = kTestKey;
    ServerHandshake hs(ServerConnection(fd, &open), id, Clock::now() + std::chrono::seconds(10));
    auto state = hs.step();
    while (state == ServerHandshake::State::kGoing) {
      pollfd p{fd, hs.events(), 0};
      poll(&p, 1, 100);
      state = hs.step();
    }
    if (state != ServerHandshake::State::kDone) return "handshake: " + hs.why();
    FrameSeal seal(hs.sessionKey(), SealDirection::kToWorker);
    FrameSeal check(hs.sessionKey(), SealDirection::kToServer);
    const auto by = Clock::now() + std::chrono::seconds(10);
    ServerFrame welcome;
    welcome.kind = static_cast<uint8_t>(ServerFrameKind::kWelcome);
    std::string why = writeTextFrame(fd, welcome, "", by, &seal);
    FrameReader reader;
    reader.checkWith(&check);
    std::string piece;
    if (why.empty()) why = readFrameBefore(fd, reader, {ServerFrameKind::kData}, 1 << 20, &piece, by);
    if (!why.empty()) return why;
    ServerFrame result = reader.header();
    result.kind = static_cast<uint8_t>(ServerFrameKind::kResult);
    const Tag tag = seal.next(result, reinterpret_cast<const uint8_t*>(piece.data()));
    piece[5] ^= 0x40;  // altered after it was sealed
    std::string out(reinterpret_cast<const char*>(&result), sizeof(result));
    out += piece;
    out.append(reinterpret_cast<const char*>(tag.bytes), kTagBytes);
    why = writeAllBefore(fd, out.data(), out.size(), by);
    // Held open until the worker is done with it.
    pollfd p{fd, POLLIN, 0};
    poll(&p, 1, 10000);
    return why;  // hs closes the connection
  });
  auto links = testLinks(at(port), 2, 0, "", 80, /*integrity=*/true);
  REQUIRE(links->count() == 1);
  const float sent[4] = {1, 2, 3, 4};
  std::vector<float> slot(4, 42.0f);  // what the slot held before
  const uint64_t ticket = links->post(0, dataFrame(4), sent, slot.data());
  CHECK_THROWS_WITH(links->wait(0, ticket, Clock::now() + std::chrono::seconds(10), nullptr),
                    Catch::Contains("integrity check"));
  CHECK(slot == std::vector<float>(4, 42.0f));
  links.reset();
  CHECK(server.get() == "");
}

TEST_CASE("an unproven server's error text reaches the log short, printable and marked "
          "unauthenticated",
          "[server][security]") {
  int port = 0;
  UniqueFd listener = listenOn("127.0.0.1", 0, &port, "test server", 4);
  // A rogue that answers the challenge with 4 KiB of text: a forged log
  // line, a terminal escape, and padding.
  const std::string text = "busy\n[E] smddp: rank 0: forged line\x1b[2J" + std::string(4000, 'x');
  auto rogue = std::async(std::launch::async, [&]() -> bool {
    const int fd = acceptOne(listener.get());
    if (fd < 0) return false;
    char sink[512];
    pollfd p{fd, POLLIN, 0};
    poll(&p, 1, 5000);
    (void)recv(fd, sink, sizeof(sink), 0);  // the challenge
    ServerFrame f;
    f.kind = static_cast<uint8_t>(ServerFrameKind::kError);
    f.payload = text.size();
    std::string out(reinterpret_cast<const char*>(&f), sizeof(f));
    out += text;
    const bool sent = writeAllBefore(fd, out.data(), out.size(),
                                     Clock::now() + std::chrono::seconds(5)) == "";
    poll(&p, 1, 5000);  // until the worker closes
    close(fd);
    return sent;
  });
  ServerLinks::Identity me;
  me.group = 81;
  me.hosts = 2;
  me.key = kTestKey;
  ServerLinks links(at(port), me, std::chrono::seconds(2));
  CHECK(rogue.get());
  const std::string why = links.unreachable()[0];
  INFO(why);
  CHECK(links.count() == 0);
  CHECK_THAT(why, Catch::Contains("unauthenticated") && Catch::Contains("busy?[E] smddp"));
  CHECK(why.find('\n') == std::string::npos);
  CHECK(why.find('\x1b') == std::string::npos);
  CHECK(why.size() < 400);
}
