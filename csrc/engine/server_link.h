// A worker's connections to the standalone reduction servers
// (standalone_server.h; docs/design.md, "Standalone reduction servers").
// Host h's server rank for stream s (its server index on the host) holds one
// TCP connection to every server listed in SMDDP_SERVER_HOSTS; in each step
// of a multi-host fusion batch it pushes one piece of its host partial to
// each server and pulls the piece reduced over every host back. A server
// that dies closes its sockets: the next push or pull fails at once with
// an error that names it.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "engine/server_wire.h"

namespace smddp {

class ServerLinks {
 public:
  struct Identity {
    std::string job;      // SMDDP_SERVER_JOB
    uint64_t secret = 0;  // the group's
    int hosts = 0, host = 0, stream = 0, rank = 0;
  };
  // Connects to every server (retrying refusals: a server may start after
  // the workers), says hello and waits for its welcome, all within
  // `timeout`. Throws an error naming the server that could not be reached
  // or that refused.
  ServerLinks(const std::vector<ServerAddress>& servers, const Identity& me,
              std::chrono::milliseconds timeout);
  ~ServerLinks();  // says goodbye and closes
  ServerLinks(const ServerLinks&) = delete;
  ServerLinks& operator=(const ServerLinks&) = delete;

  int count() const { return static_cast<int>(fds_.size()); }
  // "standalone reduction server 1 (10.77.0.13:29500, SMDDP_SERVER_HOSTS[1])"
  std::string describe(int k) const;
  // Sends `f` (a data frame; payload bytes from `data`) to server k.
  void push(int k, const ServerFrame& f, const void* data,
            std::chrono::steady_clock::time_point deadline, const WaitCheck& stop);
  // Receives server k's result for the data frame `sent` into `dst`.
  void pull(int k, const ServerFrame& sent, void* dst,
            std::chrono::steady_clock::time_point deadline, const WaitCheck& stop);

 private:
  [[noreturn]] void fail(int k, const std::string& why, const std::string& during);
  std::vector<ServerAddress> servers_;
  std::vector<std::string> ips_;
  std::vector<int> fds_;
  bool broken_ = false;  // no goodbye after a failure
};

}  // namespace smddp
