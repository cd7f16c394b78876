#include "transport/socket_address.h"

#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "common/error.h"

namespace smddp {

std::string numericAddress(const void* bytes, size_t len) {
  if (!bytes || len < sizeof(sa_family_t)) return "";
  sockaddr_storage sa{};
  std::memcpy(&sa, bytes, std::min(len, sizeof(sa)));
  socklen_t need = sa.ss_family == AF_INET ? sizeof(sockaddr_in)
                   : sa.ss_family == AF_INET6 ? sizeof(sockaddr_in6)
                                              : 0;
  if (need == 0 || len < need) return "";
  char host[NI_MAXHOST];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&sa), need, host, sizeof(host), nullptr, 0,
                  NI_NUMERICHOST) != 0) {
    return "";
  }
  return host;
}

namespace {

bool parseAddress(const std::string& ip, int port, sockaddr_storage* out, socklen_t* len) {
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(ip.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res) {
    return false;
  }
  std::memcpy(out, res->ai_addr, res->ai_addrlen);
  *len = res->ai_addrlen;
  freeaddrinfo(res);
  return true;
}

}  // namespace

void setNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void boundSilence(int fd, std::chrono::milliseconds silence) {
  if (silence.count() <= 0) return;
  // Keepalive counts whole seconds: probe after a third of the bound idle,
  // then every second; TCP_USER_TIMEOUT (milliseconds) cuts the connection
  // once anything sent, probes included, stayed unacknowledged that long.
  const int secs = static_cast<int>(std::max<int64_t>(1, silence.count() / 1000));
  const int idle = std::max(1, secs / 3);
  const int interval = 1;
  const int count = std::max(1, secs - idle);
  const unsigned userTimeout = static_cast<unsigned>(silence.count());
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &userTimeout, sizeof(userTimeout));
}

// A non-loopback IPv4 address of an interface that is up, else loopback:
// where to listen when the provider's address is not an IP (efa, say).
std::string fallbackAddress() {
  ifaddrs* list = nullptr;
  std::string found;
  if (getifaddrs(&list) == 0) {
    for (ifaddrs* i = list; i && found.empty(); i = i->ifa_next) {
      if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
      if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
      found = numericAddress(i->ifa_addr, sizeof(sockaddr_in));
    }
    freeifaddrs(list);
  }
  return found.empty() ? "127.0.0.1" : found;
}

UniqueFd listenOn(const std::string& ip, int port, int* bound, const std::string& who,
                  int backlog) {
  sockaddr_storage sa{};
  socklen_t len = 0;
  SMDDP_CHECK(parseAddress(ip, port, &sa, &len), kInvalidArgument,
              who + ": '" + ip + "' is not a numeric address to listen on");
  UniqueFd fd(socket(sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  SMDDP_CHECK(fd, kTransport, who + ": socket: " + strerror(errno));
  if (port != 0) {
    int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  }
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), len) != 0 ||
      listen(fd.get(), backlog) != 0) {
    throwError(ErrorKind::kTransport, who + ": cannot listen on " + ip + ":" +
                                          std::to_string(port) + ": " + strerror(errno));
  }
  len = sizeof(sa);
  getsockname(fd.get(), reinterpret_cast<sockaddr*>(&sa), &len);
  *bound = ntohs(sa.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&sa)->sin6_port
                                          : reinterpret_cast<sockaddr_in*>(&sa)->sin_port);
  return fd;
}

// Connects from `fromIp` to ip:port, retrying refusals (the peer listens
// before it publishes, so a refusal is a transient network state or a dead
// peer) until `deadline`. Returns the fd or -1 with `why` set.
int connectBefore(const std::string& fromIp, const std::string& ip, int port,
                  std::chrono::steady_clock::time_point deadline, std::string* why) {
  sockaddr_storage to{}, from{};
  socklen_t toLen = 0, fromLen = 0;
  if (!parseAddress(ip, port, &to, &toLen)) {
    *why = "'" + ip + "' is not a numeric address";
    return -1;
  }
  const bool bindSource = parseAddress(fromIp, 0, &from, &fromLen) && from.ss_family == to.ss_family;
  while (true) {
    int fd = socket(to.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      *why = std::string("socket: ") + strerror(errno);
      return -1;
    }
    // From the provider's own address, so the liveness connection takes the
    // interface the data takes (and dies with it).
    if (bindSource) bind(fd, reinterpret_cast<sockaddr*>(&from), fromLen);
    int rc = connect(fd, reinterpret_cast<sockaddr*>(&to), toLen);
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      int n = poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count())));
      socklen_t l = sizeof(err);
      if (n == 1) getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l);
      else err = ETIMEDOUT;
    }
    if (err == 0) {
      setNoDelay(fd);
      return fd;
    }
    close(fd);
    if (std::chrono::steady_clock::now() >= deadline) {
      *why = strerror(err);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace smddp
