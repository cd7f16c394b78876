// The liveness connections between ranks on different hosts
// (transport/peer_monitor.h), without libfabric: monitors on threads of
// this process, meeting through an in-memory bootstrap, on 127.0.0.1. A
// death is a connection closed without a goodbye (dropWithoutGoodbye does
// what the kernel does for a killed process), a lost host is silence
// (freezeForTest: the sockets stay open, nothing more is sent). The
// engine's side (every wait consults the monitor) is tested through torch
// and across network namespaces in tests/python/test_cluster.py.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/crypto.h"
#include "common/error.h"
#include "transport/bootstrap.h"
#include "transport/peer_keys.h"
#include "transport/peer_monitor.h"
#include "world.h"

using namespace smddp;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

const std::string kBoot = "/0123456789abcdef0123456789abcdef0123";  // 36 characters

// Every rank's pair keys for an `n`-rank group, derived as the engine
// does (fresh X25519 pairs, published public keys).
std::vector<std::shared_ptr<const PeerKeys>> groupKeys(int n, const std::string& group = "g") {
  std::vector<X25519KeyPair> pairs;
  std::vector<std::string> publicKeys;
  for (int r = 0; r < n; ++r) {
    pairs.push_back(x25519KeyPair());
    publicKeys.push_back(pairs.back().publicKey);
  }
  std::vector<std::shared_ptr<const PeerKeys>> out;
  for (int r = 0; r < n; ++r) {
    out.push_back(std::make_shared<const PeerKeys>(
        PeerKeys::derive(r, pairs[r].privateKey, publicKeys, group, "")));
  }
  return out;
}

// Rank r's options, rank r on host hosts[r] (each of its own boot).
PeerMonitorOptions monitorOptions(int r, const std::vector<std::string>& hosts,
                                  const std::vector<std::shared_ptr<const PeerKeys>>& keys,
                                  milliseconds silence, milliseconds setup = milliseconds(10000)) {
  PeerMonitorOptions o;
  o.rank = r;
  o.size = static_cast<int>(hosts.size());
  o.keys = keys[r];
  for (const auto& h : hosts) o.hosts.push_back(h + kBoot);
  o.address = "127.0.0.1";
  o.silence = silence;
  o.setupTimeout = setup;
  return o;
}

// Opens a monitor over its own view of `boot` into `out`, or its error
// into `error`.
void openInto(InMemoryBootstrap& boot, const PeerMonitorOptions& o,
              std::unique_ptr<PeerMonitor>& out, std::string& error) {
  try {
    InMemoryBootstrap mine(boot.state());
    out = PeerMonitor::open(mine, o);
  } catch (const std::exception& e) {
    error = e.what();
  }
}

// `silences` overrides `silence` per rank (0: liveness off there); `given`
// the ranks' pair keys (else fresh ones).
std::vector<std::unique_ptr<PeerMonitor>> openAll(
    const std::vector<std::string>& hosts, milliseconds silence,
    const std::vector<milliseconds>& silences = {},
    const std::vector<std::shared_ptr<const PeerKeys>>& given = {}) {
  const int n = static_cast<int>(hosts.size());
  InMemoryBootstrap boot;
  const auto keys = given.empty() ? groupKeys(n) : given;
  std::vector<std::unique_ptr<PeerMonitor>> out(n);
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      openInto(boot, monitorOptions(r, hosts, keys, silences.empty() ? silence : silences[r]),
               out[r], errors[r]);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) REQUIRE(errors[r] == "");
  return out;
}

// Seconds until `m` reports a failure, or -1 after `limit`.
double secondsUntilFailure(const PeerMonitor& m, milliseconds limit, PeerFailure* f) {
  const auto t0 = Clock::now();
  while (Clock::now() - t0 < limit) {
    if (m.failed(f)) return std::chrono::duration<double>(Clock::now() - t0).count();
    std::this_thread::sleep_for(milliseconds(5));
  }
  return -1;
}

int connectTo(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  return fd;
}

// The bytes of a liveness message, as liveness_message.h lays them out,
// MACed with `keys` (which must hold `from` or `to`), or with a MAC of
// zeros when `keys` is null.
std::string message(uint8_t type, uint32_t from, uint32_t to, uint64_t counter,
                    const PeerKeys* keys, uint64_t leftBefore = UINT64_MAX) {
  std::string m(48, '\0');
  const uint32_t magic = 0x4C444D53;
  std::memcpy(&m[0], &magic, 4);
  m[4] = 3;
  m[5] = static_cast<char>(type);
  std::memcpy(&m[8], &from, 4);
  std::memcpy(&m[12], &to, 4);
  std::memcpy(&m[16], &counter, 8);
  std::memcpy(&m[24], &leftBefore, 8);
  if (keys) {
    const PeerMac mac = keys->mac(from, to, std::string_view(m.data(), 32));
    std::memcpy(&m[32], mac.bytes, kPeerMacBytes);
  }
  return m;
}

// What main's liveness messages were: 24 bytes, the group's secret in
// the clear where the counter is now.
std::string bearerMessage(uint8_t type, uint32_t from, uint32_t to, uint64_t secret) {
  std::string m = message(type, from, to, secret, nullptr).substr(0, 24);
  m[4] = 1;
  return m;
}

}  // namespace

TEST_CASE("peer monitor: ranks on the same host are not watched; a closed connection is a death "
          "named with its host, within 1 s",
          "[liveness]") {
  // hosts: h0 = {0, 1}, h1 = {2}, h2 = {3}
  auto m = openAll({"h0", "h0", "h1", "h2"}, milliseconds(5000));
  CHECK(m[0]->watchedRanks() == std::vector<int>{2, 3});
  CHECK(m[1]->watchedRanks() == std::vector<int>{2, 3});
  CHECK(m[2]->watchedRanks() == std::vector<int>{0, 1, 3});
  CHECK(m[3]->watchedRanks() == std::vector<int>{0, 1, 2});
  std::this_thread::sleep_for(milliseconds(300));
  PeerFailure f;
  for (int r = 0; r < 4; ++r) CHECK_FALSE(m[r]->failed(&f));

  m[3]->dropWithoutGoodbye();  // what the kernel does when rank 3 is killed
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r);
    const double s = secondsUntilFailure(*m[r], milliseconds(3000), &f);
    CHECK(s >= 0);
    CHECK(s < 1.0);
    CHECK(f.rank == 3);
    CHECK(f.who == "rank 3 on host h2 (127.0.0.1)");
    CHECK(f.what == "died");
    CHECK(f.cause.find("closed without a goodbye") != std::string::npos);
  }
}

TEST_CASE("peer monitor: a goodbye is no death, and a monitor closes within 100 ms",
          "[liveness]") {
  auto m = openAll({"h0", "h1", "h2"}, milliseconds(600));
  const auto t0 = Clock::now();
  m[2].reset();  // an orderly shutdown: goodbye, then close
  const double closeS = std::chrono::duration<double>(Clock::now() - t0).count();
  CHECK(closeS < 0.5);  // about 100 ms at most; margin for a loaded machine
  PeerFailure f;
  // Longer than the silence: a departed peer is not missed either.
  CHECK(secondsUntilFailure(*m[0], milliseconds(1500), &f) < 0);
  CHECK_FALSE(m[1]->failed(&f));
}

TEST_CASE("peer monitor: a goodbye says the first call its rank never ran, and its peers know "
          "at once which calls cannot complete",
          "[liveness]") {
  // The engine's "first unfinished call" (PeerMonitorOptions) of rank 2 is
  // 7 when it leaves; rank 1's monitor has none (unknown). The oracle is
  // the value rank 2 was given.
  InMemoryBootstrap boot;
  const auto keys = groupKeys(3);
  const std::vector<std::string> hosts = {"h0", "h1", "h2"};
  auto firstUnfinished = std::make_shared<std::atomic<uint64_t>>(3);
  std::vector<std::unique_ptr<PeerMonitor>> m(3);
  std::vector<std::string> errors(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      PeerMonitorOptions o = monitorOptions(r, hosts, keys, milliseconds(600));
      if (r == 2) o.firstUnfinished = firstUnfinished;
      openInto(boot, o, m[r], errors[r]);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) REQUIRE(errors[r] == "");
  int who = -1;
  Clock::time_point when;
  CHECK_FALSE(m[0]->leftBefore(UINT64_MAX - 1, &who, &when));  // nobody left yet
  firstUnfinished->store(7);  // its engine moved on before it left
  m[2].reset();
  const auto t0 = Clock::now();
  while (!m[0]->leftAt(2, &when) && Clock::now() - t0 < std::chrono::seconds(3)) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  REQUIRE(m[0]->leftAt(2, &when));
  CHECK(std::chrono::duration<double>(Clock::now() - t0).count() < 1.0);
  CHECK_FALSE(m[0]->leftBefore(6, &who, &when));  // it ran calls 0 .. 6
  REQUIRE(m[0]->leftBefore(7, &who, &when));
  CHECK(who == 2);
  CHECK(m[0]->leftBefore(1000, &who, &when));
  // Rank 1 knew nothing of its calls: its goodbye fails none of them.
  m[1].reset();
  const auto t1 = Clock::now();
  while (!m[0]->leftAt(1, &when) && Clock::now() - t1 < std::chrono::seconds(3)) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  REQUIRE(m[0]->leftAt(1, &when));
  REQUIRE(m[0]->leftBefore(UINT64_MAX - 1, &who, &when));
  CHECK(who == 2);
  PeerFailure f;
  CHECK(secondsUntilFailure(*m[0], milliseconds(1200), &f) < 0);  // a leave is no death
}

TEST_CASE("peer monitor: a host that falls silent is lost after SMDDP_PEER_TIMEOUT, not before",
          "[liveness]") {
  const milliseconds silence(800);
  auto m = openAll({"h0", "h1"}, silence);
  m[1]->freezeForTest();  // sockets open, no more heartbeats: a cut link
  PeerFailure f;
  const double s = secondsUntilFailure(*m[0], milliseconds(5000), &f);
  CHECK(s >= 0.8 * 0.8);  // the last beat came up to one beat interval before the freeze
  CHECK(s < 3.0);
  CHECK(f.rank == 1);
  CHECK(f.who == "rank 1 on host h1 (127.0.0.1)");
  CHECK(f.what == "was lost");
  CHECK(f.cause.find("host h1 silent for") != std::string::npos);
}

TEST_CASE("peer monitor: garbage on the listener is refused and changes nothing", "[liveness]") {
  const auto keys = groupKeys(2);
  const auto otherGroup = groupKeys(2, "another group");
  auto m = openAll({"h0", "h1"}, milliseconds(800), {}, keys);
  const int port = m[0]->listenPort();
  REQUIRE(port > 0);
  const PeerKeys& one = *keys[1];
  const std::vector<std::string> attempts = {
      "garbage, not a message at all",
      message(1, 1, 0, 1000, &one).substr(0, 10),     // truncated, then closed
      message(1, 1, 0, 1000, otherGroup[1].get()),    // another group's key
      message(1, 1, 0, 1000, nullptr),                // no MAC
      bearerMessage(1, 1, 0, 0x5eC12e7),              // main's layout, a secret in the clear
      message(1, 7, 0, 1000, nullptr),                // a rank that does not exist
      message(1, 1, 0, 1000, &one),                   // rank 1 again: it is already connected
      message(2, 1, 0, 1000, &one),                   // a beat before any hello
      std::string(1 << 20, 'x'),                      // a blob
  };
  for (const auto& bytes : attempts) {
    int fd = connectTo(port);
    size_t sent = 0;
    while (sent < bytes.size()) {
      ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;  // refused and reset mid-blob
      sent += static_cast<size_t>(n);
    }
    // The monitor closes it (read returns 0 or a reset) once it has judged it.
    char c;
    timeval tv{3, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    CHECK(recv(fd, &c, 1, 0) <= 0);
    close(fd);
  }
  // A connection that never speaks is dropped after its grace period.
  int silent = connectTo(port);
  const auto t0 = Clock::now();
  while (m[0]->refusedConnections() < attempts.size() + 1 &&
         Clock::now() - t0 < std::chrono::seconds(5)) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  close(silent);
  CHECK(m[0]->refusedConnections() == attempts.size() + 1);
  // The real link was never disturbed: heartbeats still flow both ways for
  // longer than the silence.
  std::this_thread::sleep_for(milliseconds(1200));
  PeerFailure f;
  CHECK_FALSE(m[0]->failed(&f));
  CHECK_FALSE(m[1]->failed(&f));
}

TEST_CASE("peer monitor: SMDDP_PEER_TIMEOUT=0 on a rank leaves it unwatched, and open still "
          "completes on every rank",
          "[liveness]") {
  const milliseconds on(800), off(0);
  auto m = openAll({"h0", "h1", "h2"}, on, {on, off, on});
  CHECK(m[1] == nullptr);
  CHECK(m[0]->watchedRanks() == std::vector<int>{2});
  CHECK(m[2]->watchedRanks() == std::vector<int>{0});
  {
    smddp::test::ScopedEnv env("SMDDP_PEER_TIMEOUT", "0");
    CHECK(PeerMonitor::configuredSilence().count() == 0);
  }
  smddp::test::ScopedEnv env("SMDDP_PEER_TIMEOUT", "3");
  CHECK(PeerMonitor::configuredSilence() == milliseconds(3000));
}

TEST_CASE("peer monitor: beats keep up with the most impatient rank's SMDDP_PEER_TIMEOUT",
          "[liveness]") {
  // Rank 0 alone would beat once a second; rank 1 gives up after 800 ms.
  auto m = openAll({"h0", "h1"}, milliseconds(0), {milliseconds(5000), milliseconds(800)});
  std::this_thread::sleep_for(milliseconds(2500));
  PeerFailure f;
  CHECK_FALSE(m[0]->failed(&f));
  CHECK_FALSE(m[1]->failed(&f));
}

TEST_CASE("peer monitor: a flood of connections on a listener while the group forms neither "
          "displaces a peer's connection nor makes a live peer look dead",
          "[liveness]") {
  // Rank 0 listens and publishes its port; the flood starts then, and
  // rank 1 (which connects to rank 0) joins only after 1.5 s of it: by
  // then far more connections wait on rank 0's listener than it keeps
  // (64) owing a hello, so rank 1's connection arrives behind them. The
  // flood goes on for a second after rank 1 joined, and the monitors must
  // then stay quiet for longer than the silence.
  const milliseconds silence(1500);
  InMemoryBootstrap boot;
  const auto keys = groupKeys(2);
  std::vector<std::unique_ptr<PeerMonitor>> m(2);
  std::vector<std::string> errors(2);
  auto openRank = [&](int r) {
    openInto(boot, monitorOptions(r, {"h0", "h1"}, keys, silence, milliseconds(20000)), m[r],
             errors[r]);
  };
  std::thread rank0(openRank, 0);
  std::string entry;
  const auto t0 = Clock::now();
  while (!boot.tryGet("liveness/0", &entry) && Clock::now() - t0 < std::chrono::seconds(10)) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  REQUIRE(!entry.empty());
  const int port = std::stoi(entry.substr(entry.find(' ') + 1));
  // The flood: connections that say nothing, or a few bytes of garbage,
  // opened as fast as the listener takes them and closed after a while.
  std::atomic<bool> flooding{true};
  std::atomic<int> opened{0};
  std::thread flood([&] {
    std::vector<int> held;
    while (flooding.load()) {
      int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(port));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));  // in progress or done
      if (opened++ % 3 == 0) send(fd, "junk", 4, MSG_NOSIGNAL);
      held.push_back(fd);
      if (held.size() > 400) {
        close(held.front());
        held.erase(held.begin());
      }
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
    for (int fd : held) close(fd);
  });
  std::this_thread::sleep_for(milliseconds(1500));
  std::thread rank1(openRank, 1);
  rank0.join();
  rank1.join();
  std::this_thread::sleep_for(milliseconds(1000));
  flooding = false;
  flood.join();
  REQUIRE(errors[0] == "");
  REQUIRE(errors[1] == "");
  CHECK(opened.load() > 1000);
  CHECK(m[0]->refusedConnections() > 64);  // the flood reached the listener and was turned away
  // Both links are up and beating: longer than the silence, no one is
  // reported dead or lost.
  std::this_thread::sleep_for(silence * 2);
  PeerFailure f;
  CHECK_FALSE(m[0]->failed(&f));
  INFO(f.who << " " << f.what << ": " << f.cause);
  CHECK_FALSE(m[1]->failed(&f));
  INFO(f.who << " " << f.what << ": " << f.cause);
  // And a real death is still seen at once.
  m[1]->dropWithoutGoodbye();
  CHECK(secondsUntilFailure(*m[0], milliseconds(3000), &f) >= 0);
  CHECK(f.what == "died");
}

TEST_CASE("peer monitor: a hello with the group's old secret, MACed for another pair, or "
          "reflected cannot take over a link while the group forms",
          "[liveness]") {
  // Rank 0 listens first; before ranks 1 and 2 connect, an intruder offers
  // it hellos "from rank 2" that are not rank 2's: main's bearer layout
  // (the group's secret, which anyone who reads the store has), rank 1's
  // genuine hello with its sender changed, and rank 0's own hello to rank 2
  // sent back with the ranks swapped. On main the first took rank 2's slot
  // (rank 0 answered it with its own hello, and turned the real rank 2
  // away). Each must be closed unanswered, and the real ranks then form.
  InMemoryBootstrap boot;
  const auto keys = groupKeys(3);
  std::vector<std::unique_ptr<PeerMonitor>> m(3);
  std::vector<std::string> errors(3);
  auto openRank = [&](int r) {
    openInto(boot, monitorOptions(r, {"h0", "h1", "h2"}, keys, milliseconds(1500),
                                  milliseconds(20000)),
             m[r], errors[r]);
  };
  std::thread rank0(openRank, 0);
  std::string entry;
  const auto t0 = Clock::now();
  while (!boot.tryGet("liveness/0", &entry) && Clock::now() - t0 < std::chrono::seconds(10)) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  REQUIRE(!entry.empty());
  const int port = std::stoi(entry.substr(entry.find(' ') + 1));
  std::string moved = message(1, 1, 0, 1, keys[1].get());  // rank 1's real hello ...
  const uint32_t two = 2;
  std::memcpy(&moved[8], &two, 4);                          // ... now "from rank 2"
  std::string reflected = message(1, 0, 2, 1, keys[0].get());  // rank 0's hello to rank 2 ...
  const uint32_t zero = 0;
  std::memcpy(&reflected[8], &two, 4);                          // ... sent back to it
  std::memcpy(&reflected[12], &zero, 4);
  const std::vector<std::pair<const char*, std::string>> forgeries = {
      {"the group's secret in main's layout", bearerMessage(1, 2, 0, 0x5eC12e7)},
      {"rank 1's hello with another sender", moved},
      {"rank 0's own hello to rank 2, reflected", reflected},
  };
  // Sent before ranks 1 and 2 join: rank 0 judges them first (its thread
  // starts once every rank has published its address).
  std::vector<int> fds;
  for (const auto& [what, bytes] : forgeries) {
    fds.push_back(connectTo(port));
    REQUIRE(send(fds.back(), bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
            static_cast<ssize_t>(bytes.size()));
  }
  std::thread rank1(openRank, 1), rank2(openRank, 2);
  rank0.join();
  rank1.join();
  rank2.join();
  for (size_t i = 0; i < fds.size(); ++i) {
    INFO(forgeries[i].first);
    // Taken: rank 0 answers with its hello. Refused: it closes unanswered.
    char reply[64];
    timeval tv{5, 0};
    setsockopt(fds[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    const ssize_t n = recv(fds[i], reply, sizeof(reply), 0);
    CHECK((n == 0 || (n < 0 && errno == ECONNRESET)));
    close(fds[i]);
  }
  REQUIRE(errors[0] == "");
  REQUIRE(errors[1] == "");
  REQUIRE(errors[2] == "");
  // Each forgery was refused (above: closed unanswered); a real rank's
  // connection that lost a race under load may be refused and retried too.
  CHECK(m[0]->refusedConnections() >= forgeries.size());
  // The real links carry the beats: no one is lost for longer than the silence.
  std::this_thread::sleep_for(milliseconds(3000));
  PeerFailure f;
  for (int r = 0; r < 3; ++r) {
    CHECK_FALSE(m[r]->failed(&f));
    INFO(f.who << " " << f.what << ": " << f.cause);
  }
}
