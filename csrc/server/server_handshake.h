// The server's side of one connection's handshake (server_auth.h:
// challenge in, answer out, hello in and its proof checked), moved on
// without blocking by the accept loop that took the connection. A
// connection costs the server no thread and no buffer larger than a hello
// until it has proved it holds the key: a flood of connections that never
// do costs descriptors (bounded: SMDDP_SERVER_MAX_CONNECTIONS) and nothing
// else.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "server/server_auth.h"
#include "server/server_connection.h"
#include "server/server_wire.h"

namespace smddp {

// Who one server is: what it proves itself with (server_auth.h).
struct ServerIdentity {
  std::string key;  // the shared key; never logged, never sent
  std::string job;  // the job it serves ("": whichever job the worker names)
  // "ip:port" addresses workers may dial besides the one the connection
  // reached (--advertise, behind NAT), in endpointText's spelling.
  std::vector<std::string> advertised;
};

class ServerHandshake {
 public:
  using Clock = std::chrono::steady_clock;
  enum class State { kGoing, kDone, kFailed };

  // `identity` must outlive the handshake.
  // `source`: the peer's address without its port, for per-source limits.
  ServerHandshake(ServerConnection conn, const ServerIdentity& identity,
                  Clock::time_point deadline, std::string source = "");
  ~ServerHandshake();
  ServerHandshake(const ServerHandshake&) = delete;
  ServerHandshake& operator=(const ServerHandshake&) = delete;

  // Moves on with whatever the socket holds or takes now. kDone: the hello
  // is in and proved (hello(), job(), sessionKey()); kFailed: why() says
  // why, and the caller closes the connection after telling it refusal()
  // (unless empty: a peer that went away or said nothing hears nothing).
  State step();
  // What to poll the socket for while going.
  short events() const;
  Clock::time_point deadline() const { return deadline_; }
  Clock::time_point started() const { return started_; }
  int fd() const { return conn_.fd(); }
  const std::string& source() const { return source_; }

  const std::string& why() const { return why_; }
  const std::string& refusal() const { return refusal_; }
  const ServerFrame& hello() const { return hello_; }
  const std::string& job() const { return job_; }
  std::string sessionKey() const { return proofs().sessionKey(shared_); }
  // The address the worker said it dialled ("" before its challenge).
  const std::string& dialled() const { return dialled_; }
  ServerConnection release() { return std::move(conn_); }

 private:
  State fail(const std::string& why, const std::string& refusal);
  State onChallenge();
  State onHello();
  Handshake proofs() const {
    return Handshake(key_, worker_, server_, workerShare_, share_.publicKey);
  }

  ServerConnection conn_;
  const ServerIdentity& identity_;
  std::string key_;  // serverIdentityKey for this connection, once challenged
  std::string dialled_;
  std::string source_;
  std::string misdialled_;  // why the worker will not believe this server, or ""
  Clock::time_point started_, deadline_;
  enum class Phase { kChallenge, kAnswer, kHello } phase_ = Phase::kChallenge;
  FrameReader reader_;
  std::string payload_;  // the frame being read: a nonce, or a proof and a job id
  std::string outbox_;   // the answer, until the socket took it
  Nonce worker_, server_;
  std::string workerShare_;  // the worker's X25519 public key
  X25519KeyPair share_;      // this side's, made at the challenge
  std::string shared_;       // their X25519 secret, wiped with the handshake
  ServerFrame hello_;
  std::string job_;
  std::string why_, refusal_;
};

}  // namespace smddp
