// A worker's connections to the standalone reduction servers
// (standalone_server.h; docs/design.md, "Standalone reduction servers").
// Host h's server rank for stream s (its server index on the host) holds one
// TCP connection to every server listed in SMDDP_SERVER_HOSTS; in each step
// of a multi-host fusion batch it posts one piece of its host partial to
// each server and takes the piece reduced over every host back. Nothing
// here blocks unless asked to (wait): a post queues its frame and sends
// what the socket takes, and progress() sends the rest and reads whatever
// results came back, so a worker keeps many steps in flight and never
// stops reading while it sends (a blocking send of step k+1 while the
// server blocks sending step k's result to this worker would deadlock
// once both directions' socket buffers fill). A server that dies closes
// its sockets: the next progress() fails at once with an error naming it.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
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

  int count() const { return static_cast<int>(links_.size()); }
  // "standalone reduction server 1 (10.77.0.13:29500, SMDDP_SERVER_HOSTS[1])"
  std::string describe(int k) const;

  // Queues the data frame `f` (payload from `data`) for server k and the
  // result it answers with, to land in `dst` (which may be `data`: the
  // server answers only once every host's piece, this one included, has
  // arrived). Sends what the socket takes now. `data` must stay valid
  // until sent and `dst` until received. Returns a ticket for received().
  uint64_t post(int k, const ServerFrame& f, const void* data, void* dst);
  // Sends and reads what the sockets allow, without blocking; true if any
  // byte moved. Throws an error naming the server on a closed connection,
  // a silent host (TCP_USER_TIMEOUT), an error frame or a result that is
  // not the piece expected next.
  bool progress();
  // Whether server k's result for the post that returned `ticket` is in.
  bool received(int k, uint64_t ticket) const { return links_[k].received > ticket; }
  // progress() until that result is in, waiting in poll slices of 100 ms;
  // throws "timed out" at `deadline`, or `stop`'s text when it returns one.
  void wait(int k, uint64_t ticket, std::chrono::steady_clock::time_point deadline,
            const WaitCheck& stop);
  // The results still awaited, for desync reports; "" if none.
  std::string waitingOn() const;
  // After a failed batch: frames it queued point into memory the caller
  // reuses, and the server's answers to them would land there. Drops them
  // and fails every later post with `why` (the stream is out of step with
  // the server's, and the group is broken anyway).
  void abandon(const std::string& why);

 private:
  struct Link {
    int fd = -1;
    FrameWriter out;  // data frames, payloads in the caller's memory
    FrameReader in;   // results, read straight into their step's slot
    struct Expect {
      ServerFrame sent;
      uint8_t* dst = nullptr;
    };
    std::deque<Expect> expect;
    uint64_t posted = 0, received = 0;
  };
  bool send(int k);
  bool receive(int k);
  [[noreturn]] void fail(int k, const std::string& why, const std::string& during);
  std::vector<ServerAddress> servers_;
  std::vector<std::string> ips_;
  std::vector<Link> links_;
  bool broken_ = false;  // no goodbye after a failure
  std::string abandoned_;
};

}  // namespace smddp
