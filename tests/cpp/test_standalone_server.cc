// Standalone reduction servers at work (server/standalone_server.h,
// server_link.h; docs/design.md, "Standalone reduction servers"),
// torch-free: a real server on loopback fed by H worker links on threads.
// Results equal an independent host-order sum (narrow pieces too: read
// back, summed in f32, packed once), garbage and foreign jobs are
// refused with a clear error, a stopped server fails every worker's pull
// naming it, an unreachable server is left out while the others still
// reduce, and a long-lived server does not grow. The wire itself (codec,
// frame reader and writer, parser, piece split, the group's verdict) is in
// test_server_wire.cc.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "reduce/narrow_wire.h"
#include "server/server_link.h"
#include "server/server_wire.h"
#include "server/standalone_server.h"
#include "server_test_frames.h"

using namespace smddp;
using Clock = std::chrono::steady_clock;

namespace {

std::unique_ptr<ServerLinks> link(const std::vector<ServerAddress>& servers, int hosts, int host,
                                  const std::string& job = "", uint64_t group = 42) {
  return testLinks(servers, hosts, host, job, group);
}

// A raw host that joins a stream with a good handshake (and `job`) and
// reads its welcome: a worker the test drives byte by byte from then on.
int rawHost(int port, int hosts, int host, uint64_t group, const std::string& job) {
  int fd = rawConnect(port);
  REQUIRE(fd >= 0);
  REQUIRE(rawHandshake(fd, helloFor(hosts, host, group), job) == "");
  return fd;
}

// Reads the server's answer to a raw connection: an error frame's text.
std::string answerText(int fd) {
  ServerFrame f;
  if (recv(fd, &f, sizeof(f), MSG_WAITALL) != sizeof(f)) return "<no answer>";
  if (!validateServerFrame(f, {ServerFrameKind::kError}).empty()) return "<not an error frame>";
  std::string text(f.payload, '\0');
  if (recv(fd, text.data(), text.size(), MSG_WAITALL) != static_cast<ssize_t>(text.size())) {
    return "<short text>";
  }
  return text;
}

// Hosts 0 and 1 of a stream push one piece each at once (threads) to
// server 0 of their links: host h sends {1 + h, 2, 3}, and both must get
// the two-host sum {3, 4, 6} back.
void twoHostsSum(ServerLinks& host0, ServerLinks& host1) {
  ServerLinks* links[2] = {&host0, &host1};
  std::vector<float> out[2];
  std::vector<std::thread> hosts;
  for (int h = 0; h < 2; ++h) {
    hosts.emplace_back([&, h] {
      ServerFrame f = dataFrame(3);
      float v[3] = {1.0f + h, 2.0f, 3.0f};
      out[h].assign(3, 0);
      links[h]->wait(0, links[h]->post(0, f, v, out[h].data()),
                     Clock::now() + std::chrono::seconds(10), nullptr);
    });
  }
  for (auto& t : hosts) t.join();
  CHECK(out[0] == std::vector<float>{3, 4, 6});
  CHECK(out[1] == out[0]);
}

}  // namespace

TEST_CASE("a standalone server sums every host's piece in host order", "[server]") {
  StandaloneServer server(testServer(2, "jobA"));
  const auto servers = loopback(server);
  for (int H : {2, 3}) {
    std::vector<std::thread> hosts;
    std::vector<std::string> errors(H);
    std::vector<std::vector<std::vector<float>>> results(H);
    const std::vector<uint64_t> counts = {0, 1, 7, 1000, 65536};
    for (int h = 0; h < H; ++h) {
      hosts.emplace_back([&, h] {
        try {
          auto links = link(servers, H, h, "jobA", 1000 + H);
          for (size_t i = 0; i < counts.size(); ++i) {
            for (int k = 0; k < links->count(); ++k) {
              // Host h's piece: values whose float sum depends on the order.
              std::vector<float> v(counts[i]);
              for (uint64_t e = 0; e < counts[i]; ++e) {
                v[e] = h == 0 ? 1e8f : (h == 1 ? -1e8f : 1.0f) + static_cast<float>(e % 3) * 0.5f;
              }
              ServerFrame f = dataFrame(counts[i]);
              f.seq = 5;
              f.step = i * 10 + k;
              const auto deadline = Clock::now() + std::chrono::seconds(20);
              std::vector<float> out(counts[i], -1.0f);
              links->wait(k, links->post(k, f, v.data(), out.data()), deadline, nullptr);
              results[h].push_back(out);
            }
          }
        } catch (const std::exception& e) {
          errors[h] = e.what();
        }
      });
    }
    for (auto& t : hosts) t.join();
    for (int h = 0; h < H; ++h) CHECK(errors[h] == "");
    // The oracle: each element's pieces summed in host order, in float.
    size_t j = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
      for (int k = 0; k < 2; ++k, ++j) {
        for (uint64_t e = 0; e < counts[i]; ++e) {
          float sum = 0;
          for (int h = 0; h < H; ++h) {
            float x = h == 0 ? 1e8f : (h == 1 ? -1e8f : 1.0f) + static_cast<float>(e % 3) * 0.5f;
            sum = h == 0 ? x : sum + x;
          }
          for (int h = 0; h < H; ++h) {
            REQUIRE(results[h].size() > j);
            REQUIRE(std::memcmp(&results[h][j][e], &sum, sizeof(float)) == 0);
          }
        }
      }
    }
  }
  CHECK(server.piecesReduced() == 2 * 5 * 2);
}

namespace {

// H hosts push one narrow piece each (kServerFlagNarrowWire) to server 0:
// host h's f32 values value(h, e), packed in `wire`. Returns each host's
// result read back to f32, or throws the first host's error.
std::vector<std::vector<float>> narrowPush(StandaloneServer& server, int H, DataType wire,
                                           uint64_t count, uint64_t group,
                                           float (*value)(int h, uint64_t e),
                                           float badScale = 0.0f) {
  const auto servers = loopback(server);
  std::vector<std::vector<float>> out(H);
  std::vector<std::string> errors(H);
  std::vector<std::thread> hosts;
  for (int h = 0; h < H; ++h) {
    hosts.emplace_back([&, h] {
      try {
        auto links = link(servers, H, h, "", group);
        std::vector<float> v(count), scratch(count + 1);
        for (uint64_t e = 0; e < count; ++e) v[e] = value(h, e);
        std::vector<uint8_t> packed(narrowWireBytes(count, wire));
        std::vector<uint8_t> result(packed.size(), 0xee);
        packNarrowWire(packed.data(), v.data(), count, wire, scratch.data());
        if (h == 0 && badScale != 0.0f) std::memcpy(packed.data(), &badScale, sizeof(float));
        ServerFrame f = dataFrame(count, wire);
        f.flags = kServerFlagNarrowWire;
        f.payload = packed.size();
        links->wait(0, links->post(0, f, packed.data(), result.data()),
                    Clock::now() + std::chrono::seconds(20), nullptr);
        out[h].assign(count, -1.0f);
        REQUIRE(unpackNarrowWire(out[h].data(), result.data(), count, wire));
      } catch (const std::exception& e) {
        errors[h] = e.what();
      }
    });
  }
  for (auto& t : hosts) t.join();
  for (int h = 0; h < H; ++h) {
    if (!errors[h].empty()) {
      throw std::runtime_error("host " + std::to_string(h) + ": " + errors[h]);
    }
  }
  return out;
}

// Integers whose sums over three hosts stay within 8 significant bits:
// exact in bf16 and, at any power-of-two scale, in f16.
float smallInt(int h, uint64_t e) {
  return static_cast<float>(static_cast<int>(e % 41) - 20 + 7 * h);
}
// 1 + 2^-8, halfway between two bf16 values: each host's piece rounds to
// 1 (ties to even) before the sum.
float halfwayOne(int, uint64_t) { return 1.0f + 1.0f / 256; }

}  // namespace

TEST_CASE("a standalone server combines narrow pieces in f32 and packs the result once",
          "[server]") {
  StandaloneServer server(testServer(1));
  uint64_t group = 700;
  for (DataType wire : {DataType::kBFloat16, DataType::kFloat16}) {
    for (uint64_t count : {0, 1, 7, 1000, 65537}) {
      CAPTURE(toString(wire), count);
      const auto out = narrowPush(server, 3, wire, count, group++, smallInt);
      for (int h = 0; h < 3; ++h) {
        REQUIRE(out[h].size() == count);
        for (uint64_t e = 0; e < count; ++e) {
          REQUIRE(out[h][e] == smallInt(0, e) + smallInt(1, e) + smallInt(2, e));
        }
      }
    }
  }
  // Each contribution is rounded once on the way in: 3 x (1 + 2^-8) gives
  // 3, where summing in f32 first and rounding once would give 3 + 2^-6.
  const auto out = narrowPush(server, 3, DataType::kBFloat16, 5, group++, halfwayOne);
  for (const auto& o : out) CHECK(o == std::vector<float>(5, 3.0f));
  CHECK(server.piecesReduced() == 2 * 5 + 1);
}

TEST_CASE("a narrow piece with an invalid scale fails the stream, naming its host", "[server]") {
  StandaloneServer server(testServer(1));
  std::string err = "no error";
  try {
    narrowPush(server, 2, DataType::kBFloat16, 64, 900, smallInt, /*badScale=*/3.0f);
  } catch (const std::exception& e) {
    err = e.what();
  }
  CHECK_THAT(err, Catch::Contains("a bad frame from host 0 (rank 0)") &&
                      Catch::Contains("carries an invalid scale for bfloat16"));
}

TEST_CASE("a standalone server refuses garbage and foreign jobs with a clear error", "[server]") {
  StandaloneServer server(testServer(1, "jobA"));
  SECTION("garbage instead of a challenge") {
    int fd = rawConnect(server.ports()[0]);
    const char junk[64] = "GET / HTTP/1.1\r\nHost: nowhere\r\n\r\n";
    REQUIRE(send(fd, junk, sizeof(junk), 0) == sizeof(junk));
    CHECK_THAT(answerText(fd), Catch::Contains("bad magic"));
    close(fd);
  }
  SECTION("a connection that says nothing and closes") {
    int fd = rawConnect(server.ports()[0]);
    close(fd);
  }
  SECTION("another job") {
    try {
      link(loopback(server), 2, 0, "jobB");
      FAIL("accepted");
    } catch (const Error& e) {
      // The worker's own job is named; the one the server serves is not
      // told to anyone who asks.
      CHECK_THAT(e.what(), Catch::Contains("standalone reduction server 0") &&
                               Catch::Contains("'jobB'"));
      CHECK_THAT(e.what(), !Catch::Contains("jobA"));
    }
  }
  // Host 0 is a real worker, host 1 a raw socket that says a good hello,
  // then sends `bad` after host 0's piece (host 0 then only reads: no
  // reset races the server's error frame). Host 0's wait must fail with
  // an error that contains `named`.
  auto badSecondHost = [&](const ServerFrame& bad, const std::string& named) {
    auto good = link(loopback(server), 2, 0, "jobA");
    int fd = rawHost(server.ports()[0], 2, 1, 42, "jobA");
    ServerFrame f = dataFrame(4);
    float v[4] = {1, 2, 3, 4};
    const uint64_t ticket = good->post(0, f, v, v);
    const char tail[8] = "garbage";  // a payload that must not be read as one
    REQUIRE(send(fd, &bad, sizeof(bad), 0) == sizeof(bad));
    REQUIRE(send(fd, tail, sizeof(tail), 0) == sizeof(tail));
    try {
      good->wait(0, ticket, Clock::now() + std::chrono::seconds(10), nullptr);
      FAIL("pulled a result");
    } catch (const Error& e) {
      CHECK_THAT(e.what(), Catch::Contains(named) && Catch::Contains("host 1"));
    }
    close(fd);
  };
  SECTION("garbage after a good hello fails every host of the stream") {
    ServerFrame bad = dataFrame(4);
    bad.dtype = 77;
    badSecondHost(bad, "dtype 77");
  }
  SECTION("a goodbye that carries a payload fails the stream, naming it") {
    ServerFrame bye;
    bye.kind = static_cast<uint8_t>(ServerFrameKind::kBye);
    bye.payload = 8;
    badSecondHost(bye, "bye frame with 8 bytes");
  }
  // The server survives all of it and still serves.
  auto a = link(loopback(server), 2, 0, "jobA", 7);
  auto b = link(loopback(server), 2, 1, "jobA", 7);
  twoHostsSum(*a, *b);
}

TEST_CASE("a server that goes away fails every pull at once, naming it", "[server]") {
  auto server = std::make_unique<StandaloneServer>(testServer(1));
  const auto servers = loopback(*server);
  auto a = link(servers, 2, 0);
  auto b = link(servers, 2, 1);  // joins the stream, never sends
  ServerFrame f = dataFrame(16);
  std::vector<float> v(16, 1.0f);
  // Host 0 pushes; host 1 never does, so the server waits; then it stops.
  const uint64_t ticket = a->post(0, f, v.data(), v.data());
  auto pulled = std::async(std::launch::async, [&] {
    const auto t0 = Clock::now();
    try {
      a->wait(0, ticket, Clock::now() + std::chrono::seconds(30), nullptr);
      return std::string("pulled a result");
    } catch (const Error& e) {
      CHECK(Clock::now() - t0 < std::chrono::seconds(5));
      return std::string(e.what());
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  server->stop();
  const std::string err = pulled.get();
  // A server that stops says so; one that dies closes its sockets.
  CHECK_THAT(err, Catch::Contains("standalone reduction server 0") &&
                      Catch::Contains("127.0.0.1:" + std::to_string(servers[0].port)) &&
                      (Catch::Contains("the server is stopping") ||
                       Catch::Contains("closed its connection")));
  // A link to a port where nothing listens gives up at its deadline (at
  // least a second per server) and notes why, for the group to decide.
  ServerLinks::Identity me;
  me.hosts = 2;
  me.key = kTestKey;
  const auto t0 = Clock::now();
  ServerLinks none(servers, me, std::chrono::milliseconds(300));
  CHECK(Clock::now() - t0 < std::chrono::seconds(3));
  CHECK(none.count() == 0);
  REQUIRE(none.unreachable().size() == 1);
  CHECK_THAT(none.unreachable()[0], Catch::Contains("cannot connect") &&
                                        Catch::Contains("standalone reduction server 0") &&
                                        Catch::Contains(std::to_string(servers[0].port)));
}

TEST_CASE("an unreachable server is left out and the others still reduce", "[server]") {
  // The list: server 0 and 2 live (one process, two ports), server 1 a
  // port whose server has stopped.
  int deadPort = 0;
  {
    StandaloneServer gone(testServer(1));
    deadPort = gone.ports()[0];
  }
  StandaloneServer server(testServer(2));
  const std::vector<ServerAddress> servers = {{"127.0.0.1", server.ports()[0], ""},
                                              {"127.0.0.1", deadPort, ""},
                                              {"127.0.0.1", server.ports()[1], ""}};
  // Both hosts connect at once: a server welcomes each host as it joins.
  std::vector<std::unique_ptr<ServerLinks>> links(2);
  {
    std::vector<std::thread> t;
    for (int h = 0; h < 2; ++h) {
      t.emplace_back([&, h] {
        ServerLinks::Identity me;
        me.group = 9;
        me.hosts = 2;
        me.host = me.rank = h;
        me.key = kTestKey;
        links[h] = std::make_unique<ServerLinks>(servers, me, std::chrono::milliseconds(500));
      });
    }
    for (auto& x : t) x.join();
  }
  std::vector<std::string> reports;
  for (int h = 0; h < 2; ++h) {
    REQUIRE(links[h]);
    CHECK(links[h]->count() == 2);
    const auto& u = links[h]->unreachable();
    REQUIRE(u.size() == 3);
    CHECK(u[0].empty());
    CHECK(u[2].empty());
    CHECK_THAT(u[1], Catch::Contains("standalone reduction server 1") &&
                         Catch::Contains("127.0.0.1:" + std::to_string(deadPort)) &&
                         Catch::Contains("cannot connect"));
    reports.push_back(reachStatus("", u, 3));
  }
  // The group's verdict from both reports: server 1 out, named per rank.
  const ServerVerdict v = agreeOnServers(reports, 3, false);
  CHECK(v.error.empty());
  CHECK(v.live == std::vector<bool>{true, false, true});
  CHECK(v.inUse() == 2);
  CHECK_THAT(v.why[1], Catch::StartsWith("rank 0: standalone reduction server 1") &&
                           Catch::Contains("; rank 1: standalone reduction server 1"));
  // keep() with a live flag for a server this rank never reached is a bug.
  CHECK_THROWS_WITH(links[0]->keep({true, true, true}), Catch::Contains("did not reach"));
  // The group also drops server 0 (say another host missed it): server 2
  // alone, still named by its place in the list, sums both hosts' pieces.
  for (auto& l : links) {
    l->keep({false, false, true});
    REQUIRE(l->count() == 1);
    CHECK_THAT(l->describe(0), Catch::Contains("standalone reduction server 2") &&
                                   Catch::Contains(std::to_string(server.ports()[1])));
  }
  twoHostsSum(*links[0], *links[1]);
  CHECK(server.piecesReduced() == 1);
}

TEST_CASE("a push into a stream the server ended reports the server's reason", "[server]") {
  // Host 1 (a raw socket) leaves without a goodbye: the server fails the
  // stream, tells host 0 why and closes. Host 0's next push then meets a
  // closed socket; its error must carry the server's reason, not only a
  // broken pipe.
  StandaloneServer server(testServer(1));
  auto a = link(loopback(server), 2, 0);
  close(rawHost(server.ports()[0], 2, 1, 42, ""));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::vector<float> v(4 << 20, 1.0f);
  std::string err = "no error";
  try {
    ServerFrame f = dataFrame(v.size());
    const uint64_t ticket = a->post(0, f, v.data(), v.data());
    a->wait(0, ticket, Clock::now() + std::chrono::seconds(10), nullptr);
  } catch (const Error& e) {
    err = e.what();
  }
  CHECK_THAT(err, Catch::Contains("standalone reduction server 0") &&
                      Catch::Contains("host 1 (rank 1) closed its connection without a goodbye"));
}

TEST_CASE("a long-lived server drops streams their hosts left and joins ended threads",
          "[server]") {
  StandaloneServer server(testServer(1));
  // Host 0 of a two-host stream joins, then its group gives up on this
  // server (goodbye, close) before host 1 ever comes.
  {
    auto lone = link(loopback(server), 2, 0, "", 77);
    REQUIRE(lone->count() == 1);
    CHECK(server.streams() == 1);
    lone->keep({false});  // what a group that leaves this server out does
  }
  // Twenty connections that end at once (refused: garbage).
  for (int i = 0; i < 20; ++i) {
    int fd = rawConnect(server.ports()[0]);
    const char junk[64] = "not a challenge";
    REQUIRE(send(fd, junk, sizeof(junk), 0) == sizeof(junk));
    answerText(fd);
    close(fd);
  }
  // The stream its host left is dropped as soon as the server sees the
  // hang-up, with no hello needed to sweep it.
  const auto until = Clock::now() + std::chrono::seconds(2);
  while ((server.streams() > 0 || server.connections() > 0) && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(server.streams() == 0);
  CHECK(server.connections() == 0);
  // A whole stream of another group still serves.
  auto a = link(loopback(server), 2, 0, "", 78);
  auto b = link(loopback(server), 2, 1, "", 78);
  CHECK(server.streams() == 1);
  twoHostsSum(*a, *b);
  // The accept loop, and the last stream's loop: no thread per connection.
  CHECK(server.threads() <= 2);
}

TEST_CASE("a pull waits no longer than its deadline", "[server]") {
  StandaloneServer server(testServer(1));
  auto a = link(loopback(server), 2, 0);
  auto b = link(loopback(server), 2, 1);
  ServerFrame f = dataFrame(4);
  float v[4] = {0, 0, 0, 0};
  const uint64_t ticket = a->post(0, f, v, v);
  const auto t0 = Clock::now();
  CHECK_THROWS_WITH(a->wait(0, ticket, Clock::now() + std::chrono::milliseconds(300), nullptr),
                    Catch::Contains("timed out") && Catch::Contains("step 0"));
  CHECK(Clock::now() - t0 < std::chrono::seconds(3));
  // and a stop check ends it early with its own text
  CHECK_THROWS_WITH(a->wait(0, ticket, Clock::now() + std::chrono::seconds(30),
                            [] { return std::string("shut down"); }),
                    Catch::Contains("shut down"));
}

TEST_CASE("a worker posts far more than the sockets hold before it reads a result", "[server]") {
  // 32 steps of 2 MiB per host and server, all posted before the first
  // result is read: 64 MiB each way per connection, many times what the
  // kernel buffers on loopback. A post that blocked until the server read
  // it (while the server blocks sending this worker results it does not
  // read yet) would deadlock here; the wait's deadline turns that into a
  // failure. Oracle: every element's pieces summed in host order, in float.
  StandaloneServer server(testServer(2));
  const auto servers = loopback(server);
  constexpr int H = 3;
  constexpr int kSteps = 32;
  constexpr uint64_t kCount = 512 * 1024;
  auto value = [](int h, int step, uint64_t e) {
    return (h == 0 ? 1e8f : (h == 1 ? -1e8f : 1.0f)) + static_cast<float>(e % 5) * 0.25f +
           static_cast<float>(step);
  };
  std::vector<std::string> errors(H);
  std::vector<int> wrong(H, 0);
  std::vector<std::thread> hosts;
  for (int h = 0; h < H; ++h) {
    hosts.emplace_back([&, h] {
      try {
        auto links = link(servers, H, h, "", 99);
        std::vector<std::vector<float>> data(kSteps * links->count());
        std::vector<std::pair<int, uint64_t>> tickets;
        for (int step = 0; step < kSteps; ++step) {
          for (int k = 0; k < links->count(); ++k) {
            auto& v = data[step * links->count() + k];
            v.resize(kCount);
            for (uint64_t e = 0; e < kCount; ++e) v[e] = value(h, step, e);
            ServerFrame f = dataFrame(kCount);
            f.seq = 11;
            f.step = static_cast<uint64_t>(step);
            // The result lands where the piece came from, as in the engine.
            tickets.emplace_back(k, links->post(k, f, v.data(), v.data()));
          }
        }
        const auto deadline = Clock::now() + std::chrono::seconds(120);
        for (auto [k, t] : tickets) links->wait(k, t, deadline, nullptr);
        for (int step = 0; step < kSteps; ++step) {
          for (int k = 0; k < links->count(); ++k) {
            const auto& v = data[step * links->count() + k];
            for (uint64_t e = 0; e < kCount; ++e) {
              float sum = value(0, step, e);
              for (int g = 1; g < H; ++g) sum += value(g, step, e);
              if (std::memcmp(&v[e], &sum, sizeof(float)) != 0) ++wrong[h];
            }
          }
        }
      } catch (const std::exception& e) {
        errors[h] = e.what();
      }
    });
  }
  for (auto& t : hosts) t.join();
  for (int h = 0; h < H; ++h) {
    CHECK(errors[h] == "");
    CHECK(wrong[h] == 0);
  }
  CHECK(server.piecesReduced() == 2 * kSteps);
}

TEST_CASE("a key holder who names a live job's id but not its group cannot enter its stream",
          "[server]") {
  // The rogue holds the key file and knows the job id, not the group's
  // secret (whose one-way hash names the stream): it says host 1 of a
  // two-host stream of the job before the real host 1 does.
  StandaloneServer server(testServer(1, "jobA"));
  const auto servers = loopback(server);
  auto real0 = link(servers, 2, 0, "jobA", 42);
  int rogue = rawHost(server.ports()[0], 2, 1, 43, "jobA");
  // The real host 1 still joins, and the two real hosts' sum is the closed
  // form: the rogue's slot is in a stream of its own.
  auto real1 = link(servers, 2, 1, "jobA", 42);
  twoHostsSum(*real0, *real1);
  close(rogue);
}
