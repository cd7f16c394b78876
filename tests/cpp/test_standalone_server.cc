// Standalone reduction servers (engine/standalone_server.h, server_link.h,
// server_wire.h; docs/design.md, "Standalone reduction servers"), torch-free:
// the header codec, the frame reader and writer over a socket, the
// SMDDP_SERVER_HOSTS parser against hand-made inputs,
// the H + K piece split as a partition, and a real server on loopback fed
// by H worker links on threads: results equal an independent host-order
// sum, garbage and foreign jobs are refused with a clear error, a
// stopped server fails every worker's pull naming it, and a server no
// worker can reach is left out by the group's verdict (closed-form
// verdicts from hand-made reports) while the others still reduce.
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
#include "engine/server_link.h"
#include "engine/server_wire.h"
#include "engine/standalone_server.h"

using namespace smddp;
using Clock = std::chrono::steady_clock;

namespace {

ServerFrame dataFrame(uint64_t count, DataType dt = DataType::kFloat32) {
  ServerFrame f;
  f.kind = static_cast<uint8_t>(ServerFrameKind::kData);
  f.dtype = static_cast<uint8_t>(dt);
  f.op = static_cast<uint8_t>(ReduceOp::kSum);
  f.count = count;
  f.payload = count * elementSize(dt);
  return f;
}

std::vector<ServerAddress> loopback(const StandaloneServer& s) {
  std::vector<ServerAddress> out;
  for (int p : s.ports()) out.push_back({"127.0.0.1", p});
  return out;
}

std::unique_ptr<ServerLinks> link(const std::vector<ServerAddress>& servers, int hosts, int host,
                                  const std::string& job = "", uint64_t secret = 42) {
  ServerLinks::Identity me{job, secret, hosts, host, 0, host};
  return std::make_unique<ServerLinks>(servers, me, std::chrono::seconds(10));
}

// A raw TCP connection to a server, for the garbage tests.
int rawConnect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  return fd;
}

// A raw host that joins a stream with a good hello (and `job`) and reads
// its welcome: a worker the test drives byte by byte from then on.
int rawHost(int port, int hosts, int host, uint64_t secret, const std::string& job) {
  int fd = rawConnect(port);
  ServerFrame hello;
  hello.kind = static_cast<uint8_t>(ServerFrameKind::kHello);
  hello.hosts = static_cast<uint16_t>(hosts);
  hello.host = static_cast<uint16_t>(host);
  hello.seq = static_cast<uint64_t>(host);
  hello.secret = secret;
  hello.payload = job.size();
  REQUIRE(send(fd, &hello, sizeof(hello), 0) == sizeof(hello));
  if (!job.empty()) REQUIRE(send(fd, job.data(), job.size(), 0) == static_cast<ssize_t>(job.size()));
  ServerFrame welcome;
  REQUIRE(recv(fd, &welcome, sizeof(welcome), MSG_WAITALL) == sizeof(welcome));
  return fd;
}

// Reads the server's answer to a raw connection: an error frame's text.
std::string answerText(int fd) {
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
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
  ServerFrame hello;
  hello.kind = static_cast<uint8_t>(ServerFrameKind::kHello);
  hello.hosts = 2;
  hello.host = 2;
  CHECK_THAT(validateServerFrame(hello, {ServerFrameKind::kHello}), Catch::Contains("host 2 of 2"));
  hello.host = 1;
  CHECK(validateServerFrame(hello, {ServerFrameKind::kHello}).empty());
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

TEST_CASE("a standalone server sums every host's piece in host order", "[server]") {
  StandaloneServer server({"127.0.0.1", 0, 2, "jobA"});
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

TEST_CASE("a standalone server refuses garbage and foreign jobs with a clear error", "[server]") {
  StandaloneServer server({"127.0.0.1", 0, 1, "jobA"});
  SECTION("garbage instead of a hello") {
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
      CHECK_THAT(e.what(), Catch::Contains("standalone reduction server 0") &&
                               Catch::Contains("'jobB'") && Catch::Contains("'jobA'"));
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
  auto server = std::make_unique<StandaloneServer>(StandaloneServer::Options{"127.0.0.1", 0, 1, ""});
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
  CHECK_THAT(err, Catch::Contains("standalone reduction server 0") &&
                      Catch::Contains("127.0.0.1:" + std::to_string(servers[0].port)) &&
                      Catch::Contains("closed its connection"));
  // A link to a port where nothing listens gives up at its deadline (at
  // least a second per server) and notes why, for the group to decide.
  ServerLinks::Identity me{"", 1, 2, 0, 0, 0};
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
    StandaloneServer gone({"127.0.0.1", 0, 1, ""});
    deadPort = gone.ports()[0];
  }
  StandaloneServer server({"127.0.0.1", 0, 2, ""});
  const std::vector<ServerAddress> servers = {
      {"127.0.0.1", server.ports()[0]}, {"127.0.0.1", deadPort}, {"127.0.0.1", server.ports()[1]}};
  // Both hosts connect at once: a server welcomes each host as it joins.
  std::vector<std::unique_ptr<ServerLinks>> links(2);
  {
    std::vector<std::thread> t;
    for (int h = 0; h < 2; ++h) {
      t.emplace_back([&, h] {
        links[h] = std::make_unique<ServerLinks>(servers, ServerLinks::Identity{"", 9, 2, h, 0, h},
                                                 std::chrono::milliseconds(500));
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

TEST_CASE("a push into a stream the server ended reports the server's reason", "[server]") {
  // Host 1 (a raw socket) leaves without a goodbye: the server fails the
  // stream, tells host 0 why and closes. Host 0's next push then meets a
  // closed socket; its error must carry the server's reason, not only a
  // broken pipe.
  StandaloneServer server({"127.0.0.1", 0, 1, ""});
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
  StandaloneServer server({"127.0.0.1", 0, 1, ""});
  // Host 0 of a two-host stream joins, then its group gives up on this
  // server (goodbye, close) before host 1 ever comes.
  {
    ServerLinks lone(loopback(server), ServerLinks::Identity{"", 77, 2, 0, 0, 0},
                     std::chrono::seconds(5));
    REQUIRE(lone.count() == 1);
    CHECK(server.streams() == 1);
    lone.keep({false});  // what a group that leaves this server out does
  }
  // Twenty connections that end at once (refused: garbage).
  for (int i = 0; i < 20; ++i) {
    int fd = rawConnect(server.ports()[0]);
    const char junk[64] = "not a hello";
    REQUIRE(send(fd, junk, sizeof(junk), 0) == sizeof(junk));
    answerText(fd);
    close(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // A whole stream of another group: its first hello sweeps the left one,
  // and the accept loop has joined the finished threads by then.
  auto a = link(loopback(server), 2, 0, "", 78);
  auto b = link(loopback(server), 2, 1, "", 78);
  CHECK(server.streams() == 1);  // the new one; the abandoned one is gone
  twoHostsSum(*a, *b);
  // The accept loop, and at most the two connections of the last stream.
  CHECK(server.threads() <= 3);
}

TEST_CASE("a pull waits no longer than its deadline", "[server]") {
  StandaloneServer server({"127.0.0.1", 0, 1, ""});
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
  StandaloneServer server({"127.0.0.1", 0, 2, ""});
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
