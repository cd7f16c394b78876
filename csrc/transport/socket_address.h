// Socket addresses as people read them, and the plain TCP sockets of the
// liveness connections (peer_monitor.h). libfabric's tcp provider names an
// endpoint by its sockaddr; the liveness connections and
// `python -m torch_smddp.info` show and reuse that address.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include "common/unique_fd.h"

namespace smddp {

// The numeric IP of a socket address (sockaddr_in or sockaddr_in6 bytes),
// or "" when `bytes` is neither.
std::string numericAddress(const void* bytes, size_t len);

// Disables Nagle on a connected TCP socket (liveness messages are tiny).
void setNoDelay(int fd);

// Bounds how long a connected TCP socket may go unanswered: keepalive
// probes while it is idle, and TCP_USER_TIMEOUT for data (or probes) left
// unacknowledged. A peer host that goes silent (link or host down) then
// fails the socket's next or pending read or write with ETIMEDOUT within
// about `silence`, where TCP alone would retry for many minutes. 0: off.
void boundSilence(int fd, std::chrono::milliseconds silence);

// A non-loopback IPv4 address of an interface that is up, else loopback.
std::string fallbackAddress();

// A non-blocking listening socket on `ip` (numeric) and `port` (0: one the
// kernel picks; a fixed port is bound with SO_REUSEADDR), the port bound
// returned in *bound. Errors name `who`: a non-numeric address is
// kInvalidArgument, a failed bind or listen kTransport.
UniqueFd listenOn(const std::string& ip, int port, int* bound, const std::string& who,
                  int backlog = 128);
// The liveness connections' listener (any port); the caller owns the fd.
inline int listenOn(const std::string& ip, int* port) {
  return listenOn(ip, 0, port, "liveness listener").release();
}

// A connected non-blocking socket from `fromIp` (when it is an address of
// the same family) to ip:port, retrying refusals until `deadline`; -1 with
// `why` set if none.
int connectBefore(const std::string& fromIp, const std::string& ip, int port,
                  std::chrono::steady_clock::time_point deadline, std::string* why);

}  // namespace smddp
