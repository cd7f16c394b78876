// A standalone reduction server facing hostile peers (server/server_auth.h,
// standalone_server.h; docs/design.md, "Security"), torch-free, on
// loopback: a rogue server gets nothing but a challenge, a worker without
// the key joins nothing, a recorded hello cannot be replayed, sealed
// frames that were altered fail the stream, workers and servers that
// disagree on SMDDP_WIRE_ENCRYPT refuse each other, and every resource a peer can
// take (connections, handshakes, streams, payload memory) is bounded and
// given back. The hostile suite against a live server process and job is
// tests/python/test_server_security.py.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "server/server_auth.h"
#include "server/server_link.h"
#include "server/standalone_server.h"
#include "server_test_frames.h"
#include "world.h"

using namespace smddp;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

// This process's resident memory, in KiB (/proc/self/status).
long rssKiB() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

// Whether the peer closed `fd` (a read returns 0 or an error) within 3 s.
bool closedByPeer(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, 3000) <= 0) return false;
  char sink[4096];
  while (true) {
    const ssize_t n = recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
    if (n > 0) continue;
    return n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
  }
}

std::string keyFile(const std::string& contents, mode_t mode) {
  char path[] = "/tmp/smddp-keytest-XXXXXX";
  const int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  REQUIRE(write(fd, contents.data(), contents.size()) == static_cast<ssize_t>(contents.size()));
  close(fd);
  chmod(path, mode);
  return path;
}


// Hosts 0 and 1 each post {1 + h, 2, 3} through their links and wait for
// the result: each host's output (the closed form is {3, 4, 6}).
std::array<std::vector<float>, 2> reduceOnTwoHosts(ServerLinks& a, ServerLinks& b) {
  std::array<std::vector<float>, 2> out;
  ServerLinks* links[2] = {&a, &b};
  std::vector<std::thread> hosts;
  for (int h = 0; h < 2; ++h) {
    hosts.emplace_back([&, h] {
      float v[3] = {1.0f + h, 2.0f, 3.0f};
      out[h].assign(3, 0);
      links[h]->wait(0, links[h]->post(0, dataFrame(3), v, out[h].data()),
                     Clock::now() + std::chrono::seconds(10), nullptr);
    });
  }
  for (auto& t : hosts) t.join();
  return out;
}

}  // namespace

TEST_CASE("a rogue server that cannot prove the key gets a challenge and nothing more",
          "[server][security]") {
  // The rogue: a listener that answers the challenge with a well-formed
  // answer whose proof it cannot compute, then records every byte the
  // worker sends until the worker closes.
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  REQUIRE(bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  REQUIRE(listen(listener, 4) == 0);
  socklen_t len = sizeof(a);
  getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  std::atomic<size_t> received{0};
  std::thread rogue([&] {
    const int fd = accept(listener, nullptr, nullptr);
    if (fd < 0) return;
    timeval tv{5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ServerFrame head;
    char challenge[512];
    if (recv(fd, &head, sizeof(head), MSG_WAITALL) == sizeof(head) &&
        head.payload <= sizeof(challenge) &&
        recv(fd, challenge, head.payload, MSG_WAITALL) == static_cast<ssize_t>(head.payload)) {
      received += sizeof(head) + head.payload;
      ServerFrame answer;
      answer.kind = static_cast<uint8_t>(ServerFrameKind::kAnswer);
      answer.payload = kServerAnswerBytes;
      uint8_t junk[kServerAnswerBytes];
      randomBytes(junk, sizeof(junk));
      sendAll(fd, &answer, sizeof(answer));
      sendAll(fd, junk, sizeof(junk));
    }
    char buf[4096];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) received += static_cast<size_t>(n);
    close(fd);
  });
  try {
    testLinks({{"127.0.0.1", port, "SMDDP_SERVER_HOSTS[0]"}}, 2, 0, "job");
    FAIL("the worker accepted a server that did not prove the key");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("standalone reduction server 0 (127.0.0.1:" +
                                         std::to_string(port)) &&
                             Catch::Contains("failed authentication"));
  }
  rogue.join();
  close(listener);
  // The challenge (a header, a nonce, a key share, the address dialled and
  // the job id) is all it ever got: no hello, no group, no data.
  CHECK(received.load() == 64 + 32 + 32 + ("127.0.0.1:" + std::to_string(port)).size() + 3);
}

TEST_CASE("a server of another key is refused by the worker, and a worker without the key by "
          "the server",
          "[server][security]") {
  StandaloneServer server(testServer(1, "jobA"));
  SECTION("the worker holds another key") {
    CHECK_THROWS_WITH(testLinks(loopback(server), 2, 0, "jobA", 42, false,
                                "another key, also long enough"),
                      Catch::Contains("standalone reduction server 0 (127.0.0.1:") &&
                          Catch::Contains("failed authentication"));
  }
  SECTION("a client that skips the server's proof and guesses the worker's") {
    const int fd = rawConnect(server.ports()[0]);
    const std::string text = rawHandshake(fd, helloFor(2, 0, 5), "jobA", "a guessed key of 16+");
    // rawHandshake checks the server's proof with its own key first.
    CHECK(text == "the server's proof is wrong");
    close(fd);
    // The same, checking nothing: its hello's proof is wrong, so it is
    // refused, joins no stream and hears nothing about the server.
    const int fd2 = rawConnect(server.ports()[0]);
    ServerFrame head;
    uint8_t answer[kServerAnswerBytes];
    REQUIRE(rawChallenge(fd2, Nonce::random(), &head, answer, "jobA"));
    ServerFrame hello = helloFor(2, 0, 5);
    hello.kind = static_cast<uint8_t>(ServerFrameKind::kHello);
    hello.payload = 32 + 4;
    uint8_t guess[32] = {};
    REQUIRE(sendAll(fd2, &hello, sizeof(hello)));
    REQUIRE(sendAll(fd2, guess, sizeof(guess)));
    REQUIRE(sendAll(fd2, "jobA", 4));
    ServerFrame err;
    REQUIRE(recv(fd2, &err, sizeof(err), MSG_WAITALL) == sizeof(err));
    REQUIRE(err.kind == static_cast<uint8_t>(ServerFrameKind::kError));
    std::string why(err.payload, '\0');
    REQUIRE(recv(fd2, why.data(), why.size(), MSG_WAITALL) == static_cast<ssize_t>(why.size()));
    CHECK_THAT(why, Catch::Contains("authentication failed"));
    CHECK_THAT(why, !Catch::Contains("jobA"));
    CHECK(closedByPeer(fd2));
    close(fd2);
    CHECK(server.streams() == 0);
  }
  // The server is unharmed.
  auto a = testLinks(loopback(server), 2, 0, "jobA", 7);
  auto b = testLinks(loopback(server), 2, 1, "jobA", 7);
  CHECK(a->count() == 1);
  CHECK(b->count() == 1);
}

TEST_CASE("a recorded hello does not open a second connection", "[server][security]") {
  // The attacker saw a whole handshake: the server's nonce is fresh on the
  // next connection, so the recorded proof no longer fits.
  StandaloneServer server(testServer(1));
  const int fd = rawConnect(server.ports()[0]);
  const Nonce mine = Nonce::random();
  ServerFrame head;
  uint8_t answer[kServerAnswerBytes];
  REQUIRE(rawChallenge(fd, mine, &head, answer));
  Nonce theirs;
  std::memcpy(theirs.bytes, answer, 32);
  ServerFrame hello = helloFor(2, 0, 11);
  hello.kind = static_cast<uint8_t>(ServerFrameKind::kHello);
  hello.payload = 32;
  const std::string identity = serverIdentityKey(kTestKey, "", socketEndpoint(fd, false));
  const Mac proof = rawProofs(identity, mine, rawShare(mine), theirs, answer).workerProof(hello, "");
  close(fd);  // the recorded session ends before its hello
  // The replay: the same challenge, the same hello and proof.
  const int again = rawConnect(server.ports()[0]);
  REQUIRE(rawChallenge(again, mine, &head, answer));
  REQUIRE(sendAll(again, &hello, sizeof(hello)));
  REQUIRE(sendAll(again, proof.bytes, 32));
  ServerFrame err;
  REQUIRE(recv(again, &err, sizeof(err), MSG_WAITALL) == sizeof(err));
  CHECK(err.kind == static_cast<uint8_t>(ServerFrameKind::kError));
  close(again);
  CHECK(server.streams() == 0);
}

TEST_CASE("the session key takes the shares' X25519 secret, and a swapped share breaks the proofs",
          "[server][security]") {
  const std::string identity = serverIdentityKey(kTestKey, "jobA", "127.0.0.1:29600");
  const Nonce nw = Nonce::random(), ns = Nonce::random();
  const X25519KeyPair worker = x25519KeyPair(), server = x25519KeyPair(), middle = x25519KeyPair();
  const Handshake h(identity, nw, ns, worker.publicKey, server.publicKey);
  // Both sides reach the same secret, and so the same session key.
  const std::string atWorker = x25519SharedSecret(worker.privateKey, server.publicKey, "server");
  const std::string atServer = x25519SharedSecret(server.privateKey, worker.publicKey, "worker");
  REQUIRE(atWorker == atServer);
  const std::string session = h.sessionKey(atWorker);
  CHECK(session.size() == kMacBytes);
  // One who holds the key and recorded everything sent (nonces, shares,
  // proofs) lacks the secret: any other secret, none included, gives
  // another key.
  CHECK(h.sessionKey("") != session);
  CHECK(h.sessionKey(x25519SharedSecret(middle.privateKey, server.publicKey, "server")) != session);
  // A man in the middle who swaps in its own share, either way, breaks the
  // proof the other side checks.
  const Handshake swappedToWorker(identity, nw, ns, worker.publicKey, middle.publicKey);
  const Handshake swappedToServer(identity, nw, ns, middle.publicKey, server.publicKey);
  CHECK(!macEquals(swappedToWorker.serverProof(), h.serverProof().bytes));
  ServerFrame hello = helloFor(2, 0, 1);
  CHECK(!macEquals(swappedToServer.workerProof(hello, "jobA"), h.workerProof(hello, "jobA").bytes));
}

TEST_CASE("a challenge whose key share is a low-order point is refused", "[server][security]") {
  StandaloneServer server(testServer(1));
  const int fd = rawConnect(server.ports()[0]);
  const std::string dialled = socketEndpoint(fd, /*local=*/false);
  ServerFrame c;
  c.kind = static_cast<uint8_t>(ServerFrameKind::kChallenge);
  c.count = dialled.size();
  c.payload = kNonceBytes + kServerShareBytes + dialled.size();
  const Nonce mine = Nonce::random();
  const uint8_t zero[kServerShareBytes] = {};  // all-zero: forces a known secret
  REQUIRE(sendAll(fd, &c, sizeof(c)));
  REQUIRE(sendAll(fd, mine.bytes, kNonceBytes));
  REQUIRE(sendAll(fd, zero, sizeof(zero)));
  REQUIRE(sendAll(fd, dialled.data(), dialled.size()));
  ServerFrame head;
  REQUIRE(recv(fd, &head, sizeof(head), MSG_WAITALL) == sizeof(head));
  CHECK(head.kind == static_cast<uint8_t>(ServerFrameKind::kError));
  std::string why(std::min<uint64_t>(head.payload, kServerMaxText), '\0');
  REQUIRE(recv(fd, why.data(), why.size(), MSG_WAITALL) == static_cast<ssize_t>(why.size()));
  CHECK_THAT(why, Catch::Contains("key share"));
  CHECK(closedByPeer(fd));
  close(fd);
  CHECK(server.streams() == 0);
}

TEST_CASE("with SMDDP_SERVER_INTEGRITY every frame is sealed, and an altered one fails the stream",
          "[server][security]") {
  StandaloneServer::Options o = testServer(1);
  o.requireIntegrity = 1;
  StandaloneServer server(o);
  // A worker that does not ask for it is refused, and told why.
  CHECK_THROWS_WITH(testLinks(loopback(server), 2, 0, "", 3, false),
                    Catch::Contains("requires SMDDP_SERVER_INTEGRITY=1"));
  // Two that do reduce as ever (closed form: {1+h, 2, 3} summed).
  {
    auto a = testLinks(loopback(server), 2, 0, "", 4, true);
    auto b = testLinks(loopback(server), 2, 1, "", 4, true);
    const auto out = reduceOnTwoHosts(*a, *b);
    CHECK(out[0] == std::vector<float>{3, 4, 6});
    CHECK(out[1] == out[0]);
  }
  // Host 1 is a raw socket with the session's seals: its piece is sealed,
  // then one payload byte changes on the way. The server fails the
  // stream, and host 0 hears which host sent it.
  auto good = testLinks(loopback(server), 2, 0, "", 6, true);
  const int fd = rawConnect(server.ports()[0]);
  ServerFrame h1 = helloFor(2, 1, 6);
  h1.flags = kServerFlagIntegrity;
  RawSession session;
  REQUIRE(rawHandshake(fd, h1, "", kTestKey, &session) == "");
  float v[4] = {1, 2, 3, 4};
  const uint64_t ticket = good->post(0, dataFrame(4), v, v);
  ServerFrame f = dataFrame(4);
  f.group = 6;
  float w[4] = {5, 6, 7, 8};
  const Tag tag = session.seal->next(f, reinterpret_cast<const uint8_t*>(w));
  w[2] = 7.5f;  // altered after it was sealed
  REQUIRE(sendAll(fd, &f, sizeof(f)));
  REQUIRE(sendAll(fd, w, sizeof(w)));
  REQUIRE(sendAll(fd, tag.bytes, kTagBytes));
  CHECK_THROWS_WITH(good->wait(0, ticket, Clock::now() + std::chrono::seconds(10), nullptr),
                    Catch::Contains("host 1") && Catch::Contains("integrity check"));
  close(fd);
}

TEST_CASE("integrity is on by default: workers ask for it, servers refuse workers that turned it "
          "off, and 0 turns it off",
          "[server][security]") {
  smddp::test::ScopedEnv unset("SMDDP_SERVER_INTEGRITY", "");
  CHECK(serverIntegrityParam());
  StandaloneServer::Options o = testServer(1);
  o.requireIntegrity = -1;  // the variable decides, as for python -m torch_smddp.server
  StandaloneServer server(o);
  CHECK_THROWS_WITH(testLinks(loopback(server), 2, 0, "", 90, /*integrity=*/false),
                    Catch::Contains("requires SMDDP_SERVER_INTEGRITY=1"));
  // A worker with the defaults is welcomed, its frames sealed: a raw host
  // that joins its stream unsealed is refused.
  auto sealed = testLinks(loopback(server), 2, 0, "", 91, serverIntegrityParam());
  CHECK(sealed->count() == 1);
  const int fd = rawConnect(server.ports()[0]);
  CHECK_THAT(rawHandshake(fd, helloFor(2, 1, 91), ""),
             Catch::Contains("requires SMDDP_SERVER_INTEGRITY=1"));
  close(fd);
  smddp::test::ScopedEnv off("SMDDP_SERVER_INTEGRITY", "0");
  CHECK_FALSE(serverIntegrityParam());
}

TEST_CASE("with SMDDP_WIRE_ENCRYPT workers and servers reduce as ever, and either refuses the "
          "other when they disagree, naming it",
          "[server][security][encrypt]") {
  {
    smddp::test::ScopedEnv unset("SMDDP_WIRE_ENCRYPT", "");
    CHECK_FALSE(wireEncryptParam());  // off by default
    smddp::test::ScopedEnv on("SMDDP_WIRE_ENCRYPT", "1");
    CHECK(wireEncryptParam());
  }
  StandaloneServer::Options o = testServer(1);
  o.encrypt = 1;
  StandaloneServer server(o);
  // Two encrypting hosts: the closed form {1+h, 2, 3} summed, on a
  // server that requires no integrity (encryption brings it).
  auto a = testLinks(loopback(server), 2, 0, "", 7, false, kTestKey, /*encrypt=*/true);
  auto b = testLinks(loopback(server), 2, 1, "", 7, false, kTestKey, /*encrypt=*/true);
  // Each encrypting host reserves four times its largest piece P (256 MiB
  // here), one more than a plain host (the ciphertext of its result), and
  // half the stream's f32 room: 2P of sum and 3 widened chunks of 256 KiB.
  const int64_t piece = static_cast<int64_t>(kServerMaxPayload);
  CHECK(server.reserved() == 2 * (4 * piece + (2 * piece + 3 * (256 << 10)) / 2));
  const auto out = reduceOnTwoHosts(*a, *b);
  CHECK(out[0] == std::vector<float>{3, 4, 6});
  CHECK(out[1] == out[0]);
  // A worker that does not encrypt, sealed or not, is refused and told why.
  for (bool integrity : {false, true}) {
    CHECK_THROWS_WITH(testLinks(loopback(server), 2, 0, "", 8, integrity),
                      Catch::Contains("SMDDP_WIRE_ENCRYPT=1") &&
                          Catch::Contains("this worker does not"));
  }
  // A server without it refuses an encrypting worker; the worker reads the
  // refusal under its own seal.
  StandaloneServer::Options plainOptions = testServer(1);
  plainOptions.encrypt = 0;
  StandaloneServer plain(plainOptions);
  CHECK_THROWS_WITH(testLinks(loopback(plain), 2, 0, "", 9, true, kTestKey, true),
                    Catch::Contains("SMDDP_WIRE_ENCRYPT=1") &&
                        Catch::Contains("started without it"));
}

TEST_CASE("a worker refuses the job's key from the store unless SMDDP_SERVER_INSECURE=1",
          "[server][security]") {
  smddp::test::ScopedEnv noFile("SMDDP_SERVER_KEY_FILE", "");
  {
    smddp::test::ScopedEnv unset("SMDDP_SERVER_INSECURE", "");
    CHECK_THROWS_WITH(workerServerKey("a key from the store, 32 bytes"),
                      Catch::Contains("no key file") && Catch::Contains("SMDDP_SERVER_INSECURE=1") &&
                          Catch::Contains("SMDDP_SERVER_KEY_FILE") &&
                          !Catch::Contains("a key from the store"));
  }
  {
    smddp::test::ScopedEnv insecure("SMDDP_SERVER_INSECURE", "1");
    CHECK(workerServerKey("a key from the store, 32 bytes") == "a key from the store, 32 bytes");
  }
  // A key file still wins, insecure or not.
  const std::string file = keyFile("0123456789abcdef0123456789abcdef\n", 0600);
  smddp::test::ScopedEnv withFile("SMDDP_SERVER_KEY_FILE", file);
  CHECK(workerServerKey("a key from the store, 32 bytes") == "0123456789abcdef0123456789abcdef");
  unlink(file.c_str());
}

TEST_CASE("a FIFO at the key file's path is refused at once, not waited on", "[server][security]") {
  char dir[] = "/tmp/smddp-fifotest-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  const std::string path = std::string(dir) + "/key";
  REQUIRE(mkfifo(path.c_str(), 0600) == 0);
  auto reading = std::async(std::launch::async, [&]() -> std::string {
    try {
      readServerKeyFile(path, "SMDDP_SERVER_KEY_FILE");
      return "read a key";
    } catch (const Error& e) {
      return e.what();
    }
  });
  const bool prompt = reading.wait_for(std::chrono::seconds(3)) == std::future_status::ready;
  if (!prompt) {
    // Unblock the open that waits for a writer, so that the test ends.
    const int w = open(path.c_str(), O_WRONLY | O_NONBLOCK);
    if (w >= 0) close(w);
  }
  const std::string why = reading.get();
  CHECK(prompt);
  CHECK_THAT(why, Catch::Contains("SMDDP_SERVER_KEY_FILE=" + path) &&
                      Catch::Contains("not a regular file"));
  unlink(path.c_str());
  rmdir(dir);
}

TEST_CASE("key files: mode 0600 and a real key, or an error naming the variable and the file",
          "[server][security]") {
  const std::string good = keyFile("0123456789abcdef0123456789abcdef\n", 0600);
  CHECK(readServerKeyFile(good, "SMDDP_SERVER_KEY_FILE") == "0123456789abcdef0123456789abcdef");
  const std::string open = keyFile("0123456789abcdef0123456789abcdef", 0644);
  CHECK_THROWS_WITH(readServerKeyFile(open, "SMDDP_SERVER_KEY_FILE"),
                    Catch::Contains("SMDDP_SERVER_KEY_FILE=" + open) &&
                        Catch::Contains("mode 0644") && Catch::Contains("chmod 600"));
  const std::string shortKey = keyFile("tooshort", 0600);
  CHECK_THROWS_WITH(readServerKeyFile(shortKey, "--key-file"),
                    Catch::Contains("--key-file=" + shortKey) && Catch::Contains("at least 16"));
  CHECK_THROWS_WITH(readServerKeyFile("/nonexistent/key", "SMDDP_SERVER_KEY_FILE"),
                    Catch::Contains("SMDDP_SERVER_KEY_FILE=/nonexistent/key") &&
                        Catch::Contains("cannot open"));
  // A server with no key at all does not start.
  StandaloneServer::Options none;
  none.bindAddress = "127.0.0.1";
  {
    smddp::test::ScopedEnv unset("SMDDP_SERVER_KEY_FILE", "");
    CHECK_THROWS_WITH(StandaloneServer(none), Catch::Contains("no key"));
    // Nor does a worker that has none to prove itself with.
    CHECK_THROWS_WITH(workerServerKey(""), Catch::Contains("SMDDP_SERVER_KEY_FILE"));
  }
  {
    smddp::test::ScopedEnv set("SMDDP_SERVER_KEY_FILE", open);
    CHECK_THROWS_WITH(workerServerKey("a key from the store"), Catch::Contains("mode 0644"));
  }
  // The key itself is in no message.
  try {
    readServerKeyFile(open, "SMDDP_SERVER_KEY_FILE");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), !Catch::Contains("0123456789abcdef"));
  }
  for (const auto& p : {good, open, shortKey}) unlink(p.c_str());
}

TEST_CASE("connections are bounded: the oldest unproven one makes room, and all are given back",
          "[server][security]") {
  StandaloneServer::Options o = testServer(1);
  o.maxConnections = 8;
  StandaloneServer server(o);
  std::vector<int> idle;
  for (int i = 0; i < 30; ++i) idle.push_back(rawConnect(server.ports()[0]));
  CHECK(within(milliseconds(2000), [&] { return server.connections() <= 8; }));
  // Workers still get in: each new connection displaces an idle one.
  auto a = testLinks(loopback(server), 2, 0, "", 21);
  auto b = testLinks(loopback(server), 2, 1, "", 21);
  CHECK(a->count() == 1);
  CHECK(b->count() == 1);
  CHECK(server.connections() <= 8);
  for (int fd : idle) close(fd);
  a.reset();
  b.reset();
  CHECK(within(milliseconds(2000), [&] { return server.connections() == 0; }));
  CHECK(server.streams() == 0);
  // The accept loop joins the stream's thread on its next turn.
  CHECK(within(milliseconds(2000), [&] { return server.threads() == 1; }));
}

TEST_CASE("a connection that never proves itself is closed at its deadline",
          "[server][security]") {
  StandaloneServer::Options o = testServer(1);
  o.handshakeTimeout = milliseconds(300);
  StandaloneServer server(o);
  const int silent = rawConnect(server.ports()[0]);
  const int slow = rawConnect(server.ports()[0]);
  REQUIRE(sendAll(slow, "\x53\x4d", 2));  // two bytes of a challenge, then nothing
  CHECK(closedByPeer(silent));
  CHECK(closedByPeer(slow));
  close(silent);
  close(slow);
  CHECK(within(milliseconds(1000), [&] { return server.connections() == 0; }));
}

TEST_CASE("a stream its other hosts never join expires on a timer", "[server][security]") {
  StandaloneServer::Options o = testServer(1);
  o.streamGrace = milliseconds(200);
  StandaloneServer server(o);
  const int fd = rawConnect(server.ports()[0]);
  REQUIRE(rawHandshake(fd, helloFor(2, 0, 31, 1 << 20, /*waitMs=*/100), "") == "");
  CHECK(server.streams() == 1);
  // No hello from anyone else is needed to sweep it.
  CHECK(within(milliseconds(2000), [&] { return server.streams() == 0; }));
  CHECK(closedByPeer(fd));
  close(fd);
  CHECK(server.connections() == 0);
}

TEST_CASE("a stream's memory is what arrived: headers that announce 256 MiB take none, and a "
          "piece past its hello's limit fails the stream",
          "[server][security]") {
  StandaloneServer server(testServer(1));
  // Two streams of two raw hosts that say their pieces are up to 256 MiB,
  // then each send a header announcing one and no payload.
  const long before = rssKiB();
  std::vector<int> fds;
  for (int s = 0; s < 2; ++s) {
    for (int h = 0; h < 2; ++h) {
      const int fd = rawConnect(server.ports()[0]);
      REQUIRE(rawHandshake(fd, helloFor(2, h, 40 + s, kServerMaxPayload), "") == "");
      fds.push_back(fd);
    }
  }
  for (int fd : fds) {
    ServerFrame f = dataFrame(kServerMaxPayload, DataType::kUInt8);
    f.group = 40 + (fds[0] == fd || fds[1] == fd ? 0 : 1);
    REQUIRE(sendAll(fd, &f, sizeof(f)));
  }
  std::this_thread::sleep_for(milliseconds(300));
  const long during = rssKiB();
  INFO("RSS before " << before << " KiB, with 1 GiB announced " << during << " KiB");
  // 1 GiB announced; what grows is the connections' own state (more under
  // ASan, whose allocator keeps freed memory in quarantine), never a payload.
  CHECK(during - before < 64 * 1024);
  for (int fd : fds) close(fd);
  // A host whose hello said 16-byte pieces sends 64: the stream fails,
  // naming the limit.
  auto good = testLinks(loopback(server), 2, 0, "", 50);
  const int fd = rawConnect(server.ports()[0]);
  REQUIRE(rawHandshake(fd, helloFor(2, 1, 50, 16), "") == "");
  float v[16] = {};
  const uint64_t ticket = good->post(0, dataFrame(16), v, v);
  ServerFrame f = dataFrame(16);
  f.group = 50;
  REQUIRE(sendAll(fd, &f, sizeof(f)));
  CHECK_THROWS_WITH(good->wait(0, ticket, Clock::now() + std::chrono::seconds(10), nullptr),
                    Catch::Contains("past the 16 its hello announced"));
  close(fd);
  // The failed stream's connections close with it.
  CHECK(within(milliseconds(2000), [&] { return server.connections() == 0; }));
}
