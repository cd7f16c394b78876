// One complete stream of a standalone reduction server (standalone_server.h):
// the connections of every host's server rank for one stream of one group,
// served by one event loop on a thread of its own. It reads each host's
// frames as they come, combines a step once every host's piece of it is
// in (in host order: the workers' own servers' bits), and sends results
// while it reads on. Nothing blocks on one host: a worker busy sending step
// k+1 is not made to wait for this server to finish sending it step k.
// Memory is bounded per host: the complete frames read ahead, one frame
// being read (at most the piece size its hello announced), and the results
// not yet sent.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "server/server_auth.h"
#include "server/server_connection.h"

namespace smddp {

struct StreamHost {
  ServerConnection conn;
  int rank = -1;
  uint64_t maxPiece = 0;             // its hello's piece limit, in bytes
  std::unique_ptr<FrameSeal> check;  // frames from it (SMDDP_SERVER_INTEGRITY), or null
  std::unique_ptr<FrameSeal> seal;   // frames to it, or null
};

struct StreamCounters {
  std::atomic<uint64_t>& pieces;
  std::atomic<uint64_t>& bytes;
};

// Serves until every host said goodbye (""), a host failed or broke the
// protocol, memory ran out, or `stop` is set (the reason, which every host
// has then been told). `who` names the server in messages.
std::string serveStream(const std::string& who, uint64_t group, std::vector<StreamHost>& hosts,
                        const std::atomic<bool>& stop, StreamCounters counters);

// Tells every host of a stream that never started serving why it ends
// (best effort, within a second each).
void tellStreamHosts(std::vector<StreamHost>& hosts, const std::string& text);

}  // namespace smddp
