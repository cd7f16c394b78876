// A standalone reduction server (docs/design.md, "Standalone reduction
// servers" and "Security"): a process that owns no rank and adds reduction
// bandwidth to a job, as in Herring and BytePS. Each of its `count`
// servers listens on its own TCP port. The server ranks of every host (one
// stream per host server index) connect to each of them; for every step of
// a multi-host fusion batch, the server takes one piece of the step's host
// partial from every host, combines the pieces in host order (the same
// kernel as the workers' own servers, so the same bits), and sends the
// result back to every host (stream_service.h). Only workers that prove
// they hold the server's key (server_auth.h) join a stream; every resource
// a connection can take before it proves the key is bounded, and so is
// what a key holder may ask for (hosts, wait, reserved memory:
// docs/servers.md), and the server outlives its jobs.
// Torch-free: `python -m torch_smddp.server` drives it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/unique_fd.h"

namespace smddp {

class ServerHandshake;
class ServerLimits;
struct ServerFrame;
struct ServerIdentity;

class StandaloneServer {
 public:
  struct Options {
    std::string bindAddress = "0.0.0.0";  // numeric
    int basePort = 0;                     // server i listens on basePort + i (0: the kernel picks)
    int count = 1;
    std::string job;  // a worker of another job is refused; "" serves any job
    // Numeric addresses workers may dial this host at besides the one a
    // connection reached (--advertise, behind NAT): server i proves itself
    // to a worker that dialled one of them at its port.
    std::vector<std::string> advertise;
    // The shared key (server_auth.h): bytes, or else the key file at
    // `keyFile`, or else SMDDP_SERVER_KEY_FILE; a server has one.
    std::string key;
    std::string keyFile;
    // Refuse workers that do not ask for SMDDP_SERVER_INTEGRITY (-1: that
    // variable decides, on by default).
    int requireIntegrity = -1;
    // Encrypt every frame after the hello, and refuse workers that do not
    // ask for it, or that ask for it when this is 0 (-1: SMDDP_WIRE_ENCRYPT
    // decides, off by default).
    int encrypt = -1;
    // Open connections across the servers (0: SMDDP_SERVER_MAX_CONNECTIONS).
    int64_t maxConnections = 0;
    // Unproven connections one source address may hold per port (0:
    // SMDDP_SERVER_UNPROVEN_PER_SOURCE).
    int64_t unprovenPerSource = 0;
    // How long a connection may take to prove itself (0: 10 s).
    std::chrono::milliseconds handshakeTimeout{0};
    // An incomplete stream expires this long after the longest wait its
    // hosts' hellos announced (SMDDP_SERVER_WAIT).
    std::chrono::milliseconds streamGrace{10000};
    // The longest wait a hello may announce; a longer one is cut to it
    // (0: SMDDP_SERVER_MAX_WAIT).
    std::chrono::milliseconds maxWait{0};
    // Bytes the server may reserve for its streams' pieces across every
    // server; a host whose hello would pass it is refused (0:
    // SMDDP_SERVER_MEMORY_BUDGET).
    int64_t memoryBudget = 0;
    // Connections one job id may hold once proved, across the servers (0:
    // SMDDP_SERVER_JOB_CONNECTIONS).
    int64_t jobConnections = 0;
  };
  // Listens on every port (throws a transport error naming the address, or
  // an invalid-argument error for a missing or bad key).
  explicit StandaloneServer(Options options);
  ~StandaloneServer();  // stop()
  StandaloneServer(const StandaloneServer&) = delete;
  StandaloneServer& operator=(const StandaloneServer&) = delete;

  // The port of each server, in server order.
  const std::vector<int>& ports() const { return ports_; }
  // Closes the listeners and every connection, joins every thread. Idempotent.
  void stop();

  // Counters (any thread).
  uint64_t piecesReduced() const { return pieces_.load(); }
  uint64_t bytesReduced() const { return bytes_.load(); }
  uint64_t refused() const { return refused_.load(); }  // connections refused or failed
  // Streams open (joined by some host, not ended), connections open, and
  // threads not yet joined (accept loops and stream loops not yet reaped):
  // a server that outlives many jobs must not grow any of them.
  size_t streams() const { return static_cast<size_t>(streams_.load()); }
  size_t connections() const { return static_cast<size_t>(connections_.load()); }
  size_t threads() const;
  // Bytes reserved now for the streams' pieces (server_limits.cc), at most
  // the memory budget.
  int64_t reserved() const;
  int64_t memoryBudget() const;
  // The last refusal or failure, for logs and tests.
  std::string lastError() const;

  // Internal: a stream waiting for its hosts, and one accept loop's state.
  struct Waiting;
  struct Front;

 private:
  void acceptLoop(int server);
  // One turn of an accept loop: poll, accept, handshakes, waiting streams.
  void turn(Front& front);
  void acceptSome(Front& front);
  // Whether a new connection from `source` may join front.pending, after
  // dropping an unproven one to make room if need be (per-source share,
  // then SMDDP_SERVER_MAX_CONNECTIONS).
  bool makeRoom(Front& front, const std::string& source);
  // A connection that proved itself joins its stream (or is refused).
  void admit(Front& front, ServerHandshake& hs);
  // The stream `hello` joins, opened (and counted) if it is the first.
  std::shared_ptr<Waiting>& waitingStream(Front& front, const ServerFrame& hello);
  // Why this server refuses a proved hello whatever its limits (another
  // job; integrity or encryption it disagrees on), or "".
  std::string helloRefusal(const ServerFrame& hello, const std::string& job) const;
  void expire(Front& front);
  void startServing(int server, std::shared_ptr<Waiting> stream);
  void noteError(const std::string& text);
  // Joins the stream threads that have finished (accept loops call it).
  void reapThreads();

  Options options_;
  std::vector<std::unique_ptr<ServerIdentity>> identities_;  // per server; set before the loops
  bool requireIntegrity_ = false;
  bool encrypt_ = false;  // SMDDP_WIRE_ENCRYPT
  // What clients may hold, and what they hold (server_limits.h); set
  // before the loops, thread-safe.
  std::unique_ptr<ServerLimits> limits_;
  std::vector<UniqueFd> listeners_;
  std::vector<int> ports_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> pieces_{0}, bytes_{0}, refused_{0};
  std::atomic<int64_t> connections_{0}, streams_{0};
  mutable std::mutex mu_;  // guards everything below
  std::vector<std::thread> threads_;       // accept loops and stream loops
  std::vector<std::thread::id> finished_;  // threads of threads_ that returned
  std::string lastError_;
  // Refusals logged in the current window, and those left out of the log.
  std::chrono::steady_clock::time_point logWindow_{};
  uint64_t logged_ = 0, unlogged_ = 0;
};

}  // namespace smddp
