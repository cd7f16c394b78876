// Test helpers shared by the standalone-server tests (test_server_wire.cc,
// test_standalone_server.cc, test_server_security.cc, test_server_bounds.cc):
// frames, the key, a worker driven byte by byte over a raw socket, and a
// bounded wait for a condition.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/dtype.h"
#include "server/server_auth.h"
#include "server/server_link.h"
#include "server/server_wire.h"
#include "server/standalone_server.h"

namespace smddp {

// Waits up to `limit` for `done` (polled every 10 ms); whether it came.
template <typename F>
bool within(std::chrono::milliseconds limit, F done) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// A data frame of `count` elements of `dt` (SUM), its payload length set.
inline ServerFrame dataFrame(uint64_t count, DataType dt = DataType::kFloat32) {
  ServerFrame f;
  f.kind = static_cast<uint8_t>(ServerFrameKind::kData);
  f.dtype = static_cast<uint8_t>(dt);
  f.op = static_cast<uint8_t>(ReduceOp::kSum);
  f.count = count;
  f.payload = count * elementSize(dt);
  return f;
}

inline const std::string kTestKey = "test key: 0123456789abcdef0123456789abcdef";

// A server on loopback with the test key.
inline StandaloneServer::Options testServer(int count, const std::string& job = "") {
  StandaloneServer::Options o;
  o.bindAddress = "127.0.0.1";
  o.count = count;
  o.job = job;
  o.key = kTestKey;
  // Raw test workers write unsealed frames; the default (integrity
  // required) is test_server_security.cc's to check.
  o.requireIntegrity = 0;
  return o;
}

// A raw TCP connection to 127.0.0.1:port (-1 if it cannot connect).
inline int rawConnect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  timeval tv{5, 0};  // no read in a test waits longer
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

inline bool sendAll(int fd, const void* p, size_t n) {
  return send(fd, p, n, MSG_NOSIGNAL) == static_cast<ssize_t>(n);
}

// The X25519 share a raw worker sends with nonce `mine`: the pair whose
// private key is the nonce's bytes (a test's worker needs no other secret).
inline X25519KeyPair rawShare(const Nonce& mine) {
  return x25519KeyPair(std::string(bytesOf(mine.bytes, kNonceBytes)));
}
// What a raw worker's handshake proves, from the server's `answer`.
inline Handshake rawProofs(const std::string& identity, const Nonce& mine, const X25519KeyPair& share,
                           const Nonce& theirs, const uint8_t* answer) {
  return Handshake(identity, mine, theirs, share.publicKey,
                   bytesOf(answer + kNonceBytes, kServerShareBytes));
}
// The server's proof within an answer.
inline const uint8_t* answerProof(const uint8_t* answer) {
  return answer + kNonceBytes + kServerShareBytes;
}

// A worker's challenge (`mine`, a fresh nonce, with rawShare's share) and
// the server's answer to it, whole: its header (an answer, or an error)
// into `header`, and for an answer the server's nonce, share and proof
// into `answer` (kServerAnswerBytes). False if the exchange broke off.
// The challenge names the address the socket reached (or `dialled`) and
// the job.
inline bool rawChallenge(int fd, const Nonce& mine, ServerFrame* header, uint8_t* answer,
                         const std::string& job = "", std::string dialled = "") {
  if (dialled.empty()) dialled = socketEndpoint(fd, /*local=*/false);
  ServerFrame c;
  c.kind = static_cast<uint8_t>(ServerFrameKind::kChallenge);
  c.count = dialled.size();
  c.payload = kNonceBytes + kServerShareBytes + dialled.size() + job.size();
  const std::string share = rawShare(mine).publicKey;
  if (!sendAll(fd, &c, sizeof(c)) || !sendAll(fd, mine.bytes, kNonceBytes) ||
      !sendAll(fd, share.data(), share.size()) || !sendAll(fd, dialled.data(), dialled.size()) ||
      !sendAll(fd, job.data(), job.size())) {
    return false;
  }
  if (recv(fd, header, sizeof(*header), MSG_WAITALL) != sizeof(*header)) return false;
  return header->kind != static_cast<uint8_t>(ServerFrameKind::kAnswer) ||
         recv(fd, answer, kServerAnswerBytes, MSG_WAITALL) == kServerAnswerBytes;
}

// A worker's side of the handshake, byte by byte, on a connected socket:
// challenge, the answer checked, the hello (with `hello`'s host fields)
// and its proof. Returns "" once welcomed, else why not (an error frame's
// text, "bad answer", ...). With `hello.flags` asking for integrity, `seal`
// and `check` get the connection's frame seals (encrypting, when the flags
// ask for kServerFlagEncrypt).
struct RawSession {
  std::unique_ptr<FrameSeal> seal, check;
};
inline std::string rawHandshake(int fd, ServerFrame hello, const std::string& job,
                                const std::string& key = kTestKey, RawSession* session = nullptr) {
  const Nonce mine = Nonce::random();
  const X25519KeyPair share = rawShare(mine);
  ServerFrame a;
  uint8_t answer[kServerAnswerBytes];
  if (!rawChallenge(fd, mine, &a, answer, job)) return "no answer";
  if (a.kind == static_cast<uint8_t>(ServerFrameKind::kError)) {
    std::string text(std::min<uint64_t>(a.payload, kServerMaxText), '\0');
    recv(fd, text.data(), text.size(), MSG_WAITALL);
    return text;
  }
  if (!validateServerFrame(a, {ServerFrameKind::kAnswer}).empty()) return "bad answer";
  Nonce theirs;
  std::memcpy(theirs.bytes, answer, kNonceBytes);
  const std::string identity = serverIdentityKey(key, job, socketEndpoint(fd, /*local=*/false));
  const Handshake h = rawProofs(identity, mine, share, theirs, answer);
  if (!macEquals(h.serverProof(), answerProof(answer))) return "the server's proof is wrong";
  hello.kind = static_cast<uint8_t>(ServerFrameKind::kHello);
  hello.payload = kServerProofBytes + job.size();
  const Mac proof = h.workerProof(hello, job);
  if (!sendAll(fd, &hello, sizeof(hello)) || !sendAll(fd, proof.bytes, kMacBytes) ||
      !sendAll(fd, job.data(), job.size())) {
    return "send";
  }
  if (session && (hello.flags & kServerFlagIntegrity)) {
    const bool encrypt = hello.flags & kServerFlagEncrypt;
    const std::string shared = x25519SharedSecret(
        share.privateKey, std::string(bytesOf(answer + kNonceBytes, kServerShareBytes)), "test");
    session->seal =
        std::make_unique<FrameSeal>(h.sessionKey(shared), SealDirection::kToServer, encrypt);
    session->check =
        std::make_unique<FrameSeal>(h.sessionKey(shared), SealDirection::kToWorker, encrypt);
  }
  ServerFrame w;
  if (recv(fd, &w, sizeof(w), MSG_WAITALL) != sizeof(w)) return "no welcome";
  if (w.kind == static_cast<uint8_t>(ServerFrameKind::kError)) {
    std::string text(std::min<uint64_t>(w.payload, kServerMaxText), '\0');
    recv(fd, text.data(), text.size(), MSG_WAITALL);
    uint8_t tag[kTagBytes];
    // A sealed refusal is read (decrypted) under the connection's seal.
    if (session && session->check && recv(fd, tag, sizeof(tag), MSG_WAITALL) == sizeof(tag) &&
        !session->check->open(w, reinterpret_cast<uint8_t*>(text.data()), tag)) {
      return "the refusal's MAC is wrong";
    }
    return text;
  }
  if (session && session->check) {
    uint8_t tag[kTagBytes];
    if (recv(fd, tag, sizeof(tag), MSG_WAITALL) != sizeof(tag) ||
        !session->check->open(w, nullptr, tag)) {
      return "the welcome's MAC is wrong";
    }
  }
  return validateServerFrame(w, {ServerFrameKind::kWelcome});
}

// A hello's host fields: host `host` of `hosts`, stream 0, group `group`,
// pieces up to `maxPiece` bytes, waiting `waitMs` for the other hosts.
inline ServerFrame helloFor(int hosts, int host, uint64_t group, uint64_t maxPiece = 1 << 20,
                            uint64_t waitMs = 5000) {
  ServerFrame h;
  h.hosts = static_cast<uint16_t>(hosts);
  h.host = static_cast<uint16_t>(host);
  h.seq = static_cast<uint64_t>(host);
  h.group = group;
  h.count = maxPiece;
  h.step = waitMs;
  return h;
}

// A worker's links with the test key (host `host` of `hosts`, stream 0).
inline std::unique_ptr<ServerLinks> testLinks(const std::vector<ServerAddress>& servers, int hosts,
                                              int host, const std::string& job = "",
                                              uint64_t group = 42, bool integrity = false,
                                              const std::string& key = kTestKey,
                                              bool encrypt = false) {
  ServerLinks::Identity me;
  me.job = job;
  me.group = group;
  me.hosts = hosts;
  me.host = host;
  me.rank = host;
  me.key = key;
  me.integrity = integrity;
  me.encrypt = encrypt;
  return std::make_unique<ServerLinks>(servers, me, std::chrono::seconds(10));
}

inline std::vector<ServerAddress> loopback(const StandaloneServer& s) {
  std::vector<ServerAddress> out;
  for (size_t i = 0; i < s.ports().size(); ++i) {
    out.push_back({"127.0.0.1", s.ports()[i], "SMDDP_SERVER_HOSTS[" + std::to_string(i) + "]"});
  }
  return out;
}

}  // namespace smddp
