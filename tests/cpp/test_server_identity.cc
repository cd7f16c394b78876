// A reduction server proves who it is, not only that it holds the key
// (server_auth.h, serverIdentityKey; issue 55, finding 1): its proof is
// bound to the address the worker dialled and to the job it serves. A
// relay that forwards the handshake to the real server (registered in the
// store first, or named in SMDDP_SERVER_HOSTS under a name that leads to
// it) and a server of another job fail the worker's check, and the error
// names the address dialled. Without that binding the relay below passes
// the handshake and changes one float of every result: the test checks
// each host's sums against the closed form, so it fails either way.
#include <catch2/catch.hpp>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "server/server_auth.h"
#include "server/server_link.h"
#include "server/standalone_server.h"
#include "server_test_frames.h"

using namespace smddp;
using Clock = std::chrono::steady_clock;

namespace {

// A man in the middle: each connection it accepts, it opens its own to
// `target` and forwards every byte both ways, except that it adds 1 to
// the first float of every f32 result on the way back (integrity off: no
// tag to break).
class Relay {
 public:
  explicit Relay(int target) : target_(target) {
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    REQUIRE(bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    REQUIRE(listen(listener_, 16) == 0);
    socklen_t len = sizeof(a);
    getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { run(); });
  }
  ~Relay() {
    stop_ = true;
    acceptor_.join();
    for (auto& t : pumps_) t.join();
    for (int fd : fds_) close(fd);
    close(listener_);
  }
  int port() const { return port_; }
  int altered() const { return altered_.load(); }

 private:
  void run() {
    const auto end = Clock::now() + std::chrono::seconds(60);
    while (!stop_ && Clock::now() < end) {
      pollfd p{listener_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      const int w = accept(listener_, nullptr, nullptr);
      if (w < 0) continue;
      const int s = rawConnect(target_);
      if (s < 0) {
        close(w);
        continue;
      }
      fds_.push_back(w);
      fds_.push_back(s);
      pumps_.emplace_back([this, w, s] { copy(w, s); });
      pumps_.emplace_back([this, w, s] { rewrite(s, w); });
    }
  }
  // Worker to server: bytes as they come.
  void copy(int from, int to) {
    char buf[65536];
    while (!stop_) {
      pollfd p{from, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      const ssize_t n = recv(from, buf, sizeof(buf), 0);
      if (n <= 0 || !sendAll(to, buf, static_cast<size_t>(n))) break;
    }
    shutdown(to, SHUT_WR);
  }
  // Server to worker: frame by frame, one float of each result changed.
  void rewrite(int from, int to) {
    while (!stop_) {
      pollfd p{from, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      ServerFrame f;
      if (recv(from, &f, sizeof(f), MSG_WAITALL) != sizeof(f)) break;
      std::string body(std::min<uint64_t>(f.payload, kServerMaxPayload), '\0');
      if (!body.empty() && recv(from, body.data(), body.size(), MSG_WAITALL) !=
                               static_cast<ssize_t>(body.size())) {
        break;
      }
      if (f.kind == static_cast<uint8_t>(ServerFrameKind::kResult) &&
          f.dtype == static_cast<uint8_t>(DataType::kFloat32) && body.size() >= 4) {
        float x;
        std::memcpy(&x, body.data(), 4);
        x += 1.0f;
        std::memcpy(body.data(), &x, 4);
        altered_++;
      }
      if (!sendAll(to, &f, sizeof(f)) || !sendAll(to, body.data(), body.size())) break;
    }
    shutdown(to, SHUT_WR);
  }

  int target_, listener_ = -1, port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> altered_{0};
  std::thread acceptor_;
  // Touched by the acceptor only, then by the destructor once it joined.
  std::vector<std::thread> pumps_;
  std::vector<int> fds_;  // closed last: a pump only shuts its side down
};

// Two hosts reduce {1+h, 2, 3} through `servers` for `job`: "" when both
// got the closed form {3, 4, 6}, else the first host's error or its sums.
std::string reduceThrough(const std::vector<ServerAddress>& servers, const std::string& job,
                          uint64_t group) {
  std::string why[2];
  std::vector<std::thread> hosts;
  for (int h = 0; h < 2; ++h) {
    hosts.emplace_back([&, h] {
      try {
        auto links = testLinks(servers, 2, h, job, group);
        if (links->count() != 1) {
          why[h] = links->unreachable()[0];
          return;
        }
        float v[3] = {1.0f + h, 2.0f, 3.0f}, out[3] = {};
        links->wait(0, links->post(0, dataFrame(3), v, out), Clock::now() + std::chrono::seconds(10),
                    nullptr);
        if (out[0] != 3 || out[1] != 4 || out[2] != 6) {
          why[h] = "wrong sums " + std::to_string(out[0]) + " " + std::to_string(out[1]) + " " +
                   std::to_string(out[2]) + " (want 3 4 6)";
        }
      } catch (const std::exception& e) {
        why[h] = e.what();
      }
    });
  }
  for (auto& t : hosts) t.join();
  return why[0].empty() ? why[1] : why[0];
}

// The server's last refusal once it contains `text` (up to 3 s).
std::string lastErrorWith(const StandaloneServer& server, const std::string& text) {
  const auto until = Clock::now() + std::chrono::seconds(3);
  while (server.lastError().find(text) == std::string::npos && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return server.lastError();
}

}  // namespace

TEST_CASE("a relay that forwards the handshake to the real server fails it, naming the address "
          "dialled",
          "[server][security]") {
  StandaloneServer server(testServer(1));
  // The direct path works: the oracle and the server agree.
  REQUIRE(reduceThrough(loopback(server), "job", 60) == "");
  Relay relay(server.ports()[0]);
  const std::string at = std::to_string(relay.port());
  SECTION("registered in the store before the real server") {
    const std::string why = reduceThrough({{"127.0.0.1", relay.port(), "smddp_servers/job/0"}},
                                          "job", 61);
    CHECK_THAT(why, Catch::Contains("failed authentication") &&
                        Catch::Contains("127.0.0.1:" + at) &&
                        Catch::Contains("smddp_servers/job/0"));
  }
  SECTION("named in SMDDP_SERVER_HOSTS under a host name that leads to it") {
    const std::string why = reduceThrough({{"localhost", relay.port(), "SMDDP_SERVER_HOSTS[0]"}},
                                          "job", 62);
    CHECK_THAT(why, Catch::Contains("failed authentication") &&
                        Catch::Contains("localhost:" + at) && Catch::Contains("127.0.0.1:" + at));
  }
  // The server logs why: it was dialled as someone else.
  CHECK_THAT(lastErrorWith(server, "dialled"),
             Catch::Contains("the worker dialled 127.0.0.1:" + at) &&
                 Catch::Contains("a relay"));
  // Nothing reached the data path through it.
  CHECK(relay.altered() == 0);
  CHECK(server.piecesReduced() > 0);  // the direct run's
}

TEST_CASE("a server of another job fails the worker's check before the hello", "[server][security]") {
  StandaloneServer server(testServer(1, "jobA"));
  CHECK(reduceThrough(loopback(server), "jobA", 70) == "");
  const std::string why = reduceThrough(loopback(server), "jobB", 71);
  CHECK_THAT(why, Catch::Contains("failed authentication") && Catch::Contains("job 'jobB'") &&
                      Catch::Contains("127.0.0.1:" + std::to_string(server.ports()[0])));
  // The server never got a hello from jobB's workers: its last refusal is
  // a handshake broken off, not a hello for another job.
  CHECK_THAT(lastErrorWith(server, "during the handshake"),
             Catch::Contains("during the handshake") && !Catch::Contains("jobB"));
}
