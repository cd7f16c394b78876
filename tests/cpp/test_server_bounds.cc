// What a worker that holds the key may ask a standalone reduction server
// for (standalone_server.h; docs/servers.md, "What a key holder can ask"):
// a group of at most kServerMaxHosts hosts, a wait of at most
// SMDDP_SERVER_MAX_WAIT, and reservations within SMDDP_SERVER_MEMORY_BUDGET.
// Past each the server says no, naming the bound, and a real stream on the
// same server still gets the closed form. And what a source that never
// proves the key may hold: SMDDP_SERVER_UNPROVEN_PER_SOURCE connections,
// never another source's handshake. Torch-free, on loopback.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "reduce/narrow_wire.h"
#include "server/server_link.h"
#include "server/standalone_server.h"
#include "server_test_frames.h"
#include "world.h"

using namespace smddp;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

// The text of the next frame on `fd` if it is an error within 5 s, else "".
std::string errorText(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, 5000) <= 0) return "";
  ServerFrame f;
  if (recv(fd, &f, sizeof(f), MSG_WAITALL) != sizeof(f)) return "";
  if (f.kind != static_cast<uint8_t>(ServerFrameKind::kError)) return "";
  std::string text(std::min<uint64_t>(f.payload, kServerMaxText), '\0');
  if (recv(fd, text.data(), text.size(), MSG_WAITALL) != static_cast<ssize_t>(text.size())) {
    return "";
  }
  return text;
}

// A worker's links for host `host` of a 2-host group whose pieces are at
// most `maxPiece` bytes.
std::unique_ptr<ServerLinks> smallLinks(const StandaloneServer& s, int host, uint64_t group,
                                        uint64_t maxPiece) {
  ServerLinks::Identity me;
  me.group = group;
  me.hosts = 2;
  me.host = host;
  me.rank = host;
  me.key = kTestKey;
  me.integrity = false;
  me.maxPiece = maxPiece;
  return std::make_unique<ServerLinks>(loopback(s), me, std::chrono::seconds(10));
}

// Two hosts reduce N floats through the server: host h sends (h+1)(i+1),
// and both must get 3(i+1), exactly.
void reducesExactly(const StandaloneServer& s, uint64_t group) {
  constexpr int N = 1000;
  auto a = smallLinks(s, 0, group, N * sizeof(float));
  auto b = smallLinks(s, 1, group, N * sizeof(float));
  INFO("host 0: " << a->unreachable()[0] << "; host 1: " << b->unreachable()[0]);
  REQUIRE(a->count() == 1);
  REQUIRE(b->count() == 1);
  ServerLinks* links[2] = {a.get(), b.get()};
  std::vector<float> in[2], out[2];
  std::vector<std::thread> hosts;
  for (int h = 0; h < 2; ++h) {
    in[h].resize(N);
    out[h].assign(N, -1.0f);
    for (int i = 0; i < N; ++i) in[h][i] = static_cast<float>((h + 1) * (i + 1));
    hosts.emplace_back([&, h] {
      links[h]->wait(0, links[h]->post(0, dataFrame(N), in[h].data(), out[h].data()),
                     Clock::now() + std::chrono::seconds(10), nullptr);
    });
  }
  for (auto& t : hosts) t.join();
  for (int h = 0; h < 2; ++h) {
    for (int i = 0; i < N; ++i) REQUIRE(out[h][i] == static_cast<float>(3 * (i + 1)));
  }
}

}  // namespace

TEST_CASE("a hello may declare at most kServerMaxHosts hosts", "[server][security]") {
  StandaloneServer server(testServer(1));
  const int fd = rawConnect(server.ports()[0]);
  CHECK_THAT(rawHandshake(fd, helloFor(65535, 0, 60), ""),
             Catch::Contains("a group of 65535 hosts") && Catch::Contains("2 to 4096"));
  close(fd);
  CHECK(server.streams() == 0);
  // The largest group it serves still waits for its hosts.
  const int ok = rawConnect(server.ports()[0]);
  CHECK(rawHandshake(ok, helloFor(4096, 4095, 61), "") == "");
  CHECK(server.streams() == 1);
  close(ok);
  reducesExactly(server, 62);
}

TEST_CASE("a hello's wait is cut to SMDDP_SERVER_MAX_WAIT, and its hosts hear the stream expire",
          "[server][security]") {
  test::ScopedEnv maxWait("SMDDP_SERVER_MAX_WAIT", "1");
  StandaloneServer::Options o = testServer(1);
  o.streamGrace = milliseconds(200);
  StandaloneServer server(o);
  const int fd = rawConnect(server.ports()[0]);
  // One host of two, which says it will wait a day for the other.
  REQUIRE(rawHandshake(fd, helloFor(2, 0, 63, 1 << 20, /*waitMs=*/86400000), "") == "");
  CHECK(server.streams() == 1);
  CHECK_THAT(errorText(fd), Catch::Contains("expired with 1 of its 2 hosts"));
  CHECK(within(milliseconds(2000), [&] { return server.streams() == 0; }));
  close(fd);
}

TEST_CASE("reservations past SMDDP_SERVER_MEMORY_BUDGET are refused, naming it, while a real "
          "stream on the same server gets the closed form",
          "[server][security]") {
  test::ScopedEnv budget("SMDDP_SERVER_MEMORY_BUDGET", std::to_string(64 << 20));
  StandaloneServer server(testServer(1));
  // A key holder's hosts of 2-host streams: 8 MiB pieces reserve 3 x 8
  // MiB and half of the f32 room (16 MiB of sum, 3 x 256 KiB of widened
  // chunks): 32.375 MiB; 6 MiB pieces 24.375 MiB.
  const int a = rawConnect(server.ports()[0]);
  REQUIRE(rawHandshake(a, helloFor(2, 0, 70, 8 << 20), "") == "");
  const int b = rawConnect(server.ports()[0]);
  REQUIRE(rawHandshake(b, helloFor(2, 0, 71, 6 << 20), "") == "");
  // 256 MiB pieces would reserve a GiB: refused, and the budget named.
  const int big = rawConnect(server.ports()[0]);
  CHECK_THAT(rawHandshake(big, helloFor(2, 0, 72, 256 << 20), ""),
             Catch::Contains("past the server's memory budget") &&
                 Catch::Contains("SMDDP_SERVER_MEMORY_BUDGET") && Catch::Contains("64 MiB"));
  close(big);
  // 16.375 MiB more would pass it too.
  const int over = rawConnect(server.ports()[0]);
  CHECK_THAT(rawHandshake(over, helloFor(2, 0, 73, 4 << 20), ""),
             Catch::Contains("memory budget"));
  close(over);
  // 7.25 MiB are left: 1.75 MiB pieces would reserve 7.375 MiB (refused),
  // 1.5 MiB pieces 6.375 MiB (taken, then given back).
  const int edge = rawConnect(server.ports()[0]);
  CHECK_THAT(rawHandshake(edge, helloFor(2, 0, 77, 7 << 18), ""),
             Catch::Contains("memory budget") && Catch::Contains("share of the f32 room"));
  close(edge);
  const int fits = rawConnect(server.ports()[0]);
  CHECK(rawHandshake(fits, helloFor(2, 0, 78, 6 << 18), "") == "");
  close(fits);
  CHECK(within(milliseconds(2000), [&] { return server.streams() == 2; }));
  // What is left (7.25 MiB) serves a real 2-host stream of 4000-byte pieces.
  reducesExactly(server, 74);
  reducesExactly(server, 75);  // its reservation came back
  // Once the key holder's hosts leave, the whole budget is free again.
  close(a);
  close(b);
  CHECK(within(milliseconds(2000), [&] { return server.streams() == 0; }));
  const int all = rawConnect(server.ports()[0]);
  CHECK(rawHandshake(all, helloFor(2, 0, 76, 15 << 20), "") == "");  // 60.375 MiB
  close(all);
}

namespace {

// Connections from 127.0.0.2 (another source than the job's 127.0.0.1) to
// `port`, opened as fast as they go and left silent until `stop`; at most
// 200 held at once (the oldest closes first). Returns how many it opened.
int flood(int port, const std::atomic<bool>& stop) {
  std::deque<int> held;
  int opened = 0;
  sockaddr_in from{}, to{};
  from.sin_family = to.sin_family = AF_INET;
  inet_pton(AF_INET, "127.0.0.2", &from.sin_addr);
  inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  to.sin_port = htons(static_cast<uint16_t>(port));
  const auto end = Clock::now() + std::chrono::seconds(30);  // whatever the test does
  while (!stop.load() && Clock::now() < end) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0 ||
        connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
      close(fd);
      std::this_thread::sleep_for(milliseconds(1));
      continue;
    }
    ++opened;
    held.push_back(fd);
    if (held.size() > 200) {
      close(held.front());
      held.pop_front();
    }
  }
  for (int fd : held) close(fd);
  return opened;
}

}  // namespace

TEST_CASE("an unproven flood from one source never drops another source's handshakes",
          "[server][security]") {
  test::ScopedEnv perSource("SMDDP_SERVER_UNPROVEN_PER_SOURCE", "4");
  StandaloneServer::Options o = testServer(1);
  o.maxConnections = 16;
  StandaloneServer server(o);
  std::atomic<bool> stop{false};
  auto flooding = std::async(std::launch::async, [&] { return flood(server.ports()[0], stop); });
  // The flood fills the server before the job's hosts come.
  REQUIRE(within(milliseconds(5000), [&] { return server.refused() > 50; }));
  // Hosts of a job form their stream through it, a few times over.
  for (uint64_t g = 90; g < 95; ++g) reducesExactly(server, g);
  stop = true;
  CHECK(flooding.get() > 100);
}

namespace {

// This process's peak resident memory since resetPeak(), in KiB (-1 when
// the kernel does not offer the reset).
bool resetPeak() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}
long peakKiB() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

}  // namespace

TEST_CASE("a narrow step takes its f32 room a chunk at a time, not n x (hosts + 2) floats",
          "[server][security]") {
  // 8 raw hosts each send one bf16 piece of 8 Mi ones (16 MiB, scale 1).
  // What the server then holds: their pieces (128 MiB) and the result
  // (16), plus its f32 sum (32) and chunks; the whole widened room would
  // be 8 Mi x 10 floats, 320 MiB more.
  constexpr int H = 8;
  constexpr uint64_t n = 8ull << 20;
  StandaloneServer server(testServer(1));
  std::vector<uint8_t> piece(narrowWireBytes(n, DataType::kBFloat16));
  const float one = 1.0f;
  std::memcpy(piece.data(), &one, sizeof(one));
  const uint16_t bf16One = 0x3f80, bf16Eight = 0x4100;
  for (uint64_t e = 0; e < n; ++e) std::memcpy(&piece[4 + 2 * e], &bf16One, 2);
  std::vector<int> fds;
  for (int h = 0; h < H; ++h) {
    fds.push_back(rawConnect(server.ports()[0]));
    REQUIRE(rawHandshake(fds.back(), helloFor(H, h, 95, piece.size()), "") == "");
  }
  std::vector<uint8_t> result(piece.size());
  const bool peaks = resetPeak();
  const long before = peakKiB();
  ServerFrame f = dataFrame(n, DataType::kBFloat16);
  f.flags = kServerFlagNarrowWire;
  f.payload = piece.size();
  f.group = 95;
  for (int fd : fds) {
    REQUIRE(sendAll(fd, &f, sizeof(f)));
    REQUIRE(sendAll(fd, piece.data(), piece.size()));
  }
  for (int fd : fds) {
    ServerFrame r;
    REQUIRE(recv(fd, &r, sizeof(r), MSG_WAITALL) == sizeof(r));
    REQUIRE(r.kind == static_cast<uint8_t>(ServerFrameKind::kResult));
    REQUIRE(r.payload == piece.size());
    REQUIRE(recv(fd, result.data(), result.size(), MSG_WAITALL) ==
            static_cast<ssize_t>(result.size()));
  }
  const long grew = peakKiB() - before;
  for (int fd : fds) close(fd);
  // Every element is 8, the scale 1.
  float scale = 0;
  std::memcpy(&scale, result.data(), sizeof(scale));
  CHECK(scale == 1.0f);
  uint64_t wrong = 0;
  for (uint64_t e = 0; e < n; ++e) {
    uint16_t v;
    std::memcpy(&v, &result[4 + 2 * e], 2);
    wrong += v != bf16Eight;
  }
  CHECK(wrong == 0);
  if (!peaks) {
    WARN("no /proc/self/clear_refs: the peak is not measured");
    return;
  }
#if defined(__SANITIZE_ADDRESS__)
  // ASan's quarantine keeps freed blocks resident and hands out fresh pages,
  // so the peak measures its allocator, not the server's.
  WARN("built with AddressSanitizer: the peak is not checked");
  return;
#endif
  INFO("peak resident memory grew by " << grew / 1024 << " MiB");
  CHECK(grew < 300 * 1024);
}

TEST_CASE("one job's connections stop at SMDDP_SERVER_JOB_CONNECTIONS, and another job is served",
          "[server][security]") {
  test::ScopedEnv quota("SMDDP_SERVER_JOB_CONNECTIONS", "4");
  StandaloneServer server(testServer(1));
  // A key holder naming job "hog" holds 4 waiting hosts; the 5th is refused.
  std::vector<int> held;
  for (int g = 0; g < 4; ++g) {
    held.push_back(rawConnect(server.ports()[0]));
    REQUIRE(rawHandshake(held.back(), helloFor(2, 0, 110 + g), "hog") == "");
  }
  const int fifth = rawConnect(server.ports()[0]);
  CHECK_THAT(rawHandshake(fifth, helloFor(2, 0, 120), "hog"),
             Catch::Contains("job 'hog' already holds 4 connections") &&
                 Catch::Contains("SMDDP_SERVER_JOB_CONNECTIONS"));
  close(fifth);
  // The job without a name (the real one here) still gets the closed form.
  reducesExactly(server, 121);
  // Once the hog's hosts leave, its quota is back.
  for (int fd : held) close(fd);
  CHECK(within(milliseconds(2000), [&] { return server.streams() == 0; }));
  const int again = rawConnect(server.ports()[0]);
  CHECK(rawHandshake(again, helloFor(2, 0, 122), "hog") == "");
  close(again);
}
