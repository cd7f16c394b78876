// A standalone reduction server (docs/design.md, "Standalone reduction
// servers"): a process that owns no rank and adds reduction bandwidth to
// a job, as in Herring and BytePS. Each of its `count` servers listens on
// its own TCP port. The server ranks of every host (one stream per host
// server index) connect to each of them; for every step of a multi-host
// fusion batch, the server takes one piece of the step's host partial from
// every host, combines the pieces in host order (the same kernel as the
// workers' own servers, so the same bits), and sends the result back to
// every host. Torch-free: `python -m torch_smddp.server` drives it.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

namespace smddp {

class StandaloneServer {
 public:
  struct Options {
    std::string bindAddress = "0.0.0.0";  // numeric
    int basePort = 0;                     // server i listens on basePort + i (0: the kernel picks)
    int count = 1;
    std::string job;  // a hello for another job is refused; "" serves any job
  };
  // Listens on every port (throws a transport error naming the address).
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
  uint64_t refused() const { return refused_.load(); }  // hellos and streams refused or failed
  // Streams open (joined by some host, not ended), and threads not yet
  // joined (accept loops, and connections not yet reaped): a server that
  // outlives many jobs must not grow either.
  size_t streams() const;
  size_t threads() const;
  // The last refusal or failure, for logs and tests.
  std::string lastError() const;

 private:
  struct Stream;
  void acceptLoop(int server);
  void handshake(int server, int fd);
  void serve(int server, std::shared_ptr<Stream> stream);
  void noteError(const std::string& text);
  // Joins the connection threads that have finished (accept loops call it).
  void reapThreads();
  // Closes the streams still waiting for hosts that one of their hosts
  // hung up on (a group that gave up on this server); with mu_ held.
  void dropAbandonedStreamsLocked();

  Options options_;
  std::vector<int> listeners_;
  std::vector<int> ports_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> pieces_{0}, bytes_{0}, refused_{0};
  mutable std::mutex mu_;  // guards everything below
  // (server, group secret, stream) -> the connections of its hosts.
  std::map<std::tuple<int, uint64_t, int>, std::shared_ptr<Stream>> streams_;
  std::vector<std::thread> threads_;  // accept loops, handshakes and serving loops
  std::vector<std::thread::id> finished_;  // threads of threads_ that returned
  std::string lastError_;
};

}  // namespace smddp
