#include "engine/server_link.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/error.h"
#include "transport/peer_monitor.h"
#include "transport/socket_address.h"

namespace smddp {

namespace {

using Clock = std::chrono::steady_clock;

std::string resolve(const std::string& host, std::string* why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || !res) {
    *why = std::string("cannot resolve '") + host + "': " + gai_strerror(rc);
    return "";
  }
  std::string ip;
  for (addrinfo* a = res; a && ip.empty(); a = a->ai_next) {
    if (a->ai_family == AF_INET) ip = numericAddress(a->ai_addr, a->ai_addrlen);
  }
  for (addrinfo* a = res; a && ip.empty(); a = a->ai_next) ip = numericAddress(a->ai_addr, a->ai_addrlen);
  freeaddrinfo(res);
  if (ip.empty()) *why = "no address for '" + host + "'";
  return ip;
}

}  // namespace

std::string ServerLinks::describe(int k) const {
  const auto& s = servers_[k];
  std::string at = s.host + ":" + std::to_string(s.port);
  if (k < static_cast<int>(ips_.size()) && !ips_[k].empty() && ips_[k] != s.host) {
    at += " = " + ips_[k];
  }
  return "standalone reduction server " + std::to_string(k) + " (" + at + ", SMDDP_SERVER_HOSTS[" +
         std::to_string(k) + "])";
}

ServerLinks::ServerLinks(const std::vector<ServerAddress>& servers, const Identity& me,
                         std::chrono::milliseconds timeout)
    : servers_(servers) {
  const auto deadline = Clock::now() + timeout;
  try {
    for (int k = 0; k < static_cast<int>(servers.size()); ++k) {
      std::string why;
      ips_.push_back(resolve(servers[k].host, &why));
      if (ips_.back().empty()) fail(k, why, "connecting");
      int fd = connectBefore("", ips_.back(), servers[k].port, deadline, &why);
      if (fd < 0) fail(k, "cannot connect: " + why, "connecting");
      // A server host that goes silent (link or host down) fails the
      // pending push or pull within SMDDP_PEER_TIMEOUT, not the group's.
      boundSilence(fd, PeerMonitor::configuredSilence());
      links_.emplace_back();
      links_.back().fd = fd;
      ServerFrame hello;
      hello.kind = static_cast<uint8_t>(ServerFrameKind::kHello);
      hello.secret = me.secret;
      hello.seq = static_cast<uint64_t>(me.rank);
      hello.hosts = static_cast<uint16_t>(me.hosts);
      hello.host = static_cast<uint16_t>(me.host);
      hello.stream = static_cast<uint16_t>(me.stream);
      hello.server = static_cast<uint16_t>(k);
      why = writeTextFrame(fd, hello, me.job, deadline);
      if (!why.empty()) fail(k, "hello: " + why, "connecting");
      ServerFrame answer;
      why = readAllBefore(fd, &answer, sizeof(answer), deadline);
      if (!why.empty()) fail(k, "no welcome: " + why, "connecting");
      why = validateServerFrame(answer, {ServerFrameKind::kWelcome, ServerFrameKind::kError});
      if (!why.empty()) fail(k, "answered the hello with " + why, "connecting");
      if (answer.kind == static_cast<uint8_t>(ServerFrameKind::kError)) {
        std::string text(answer.payload, '\0');
        readAllBefore(fd, text.data(), text.size(), Clock::now() + std::chrono::seconds(1));
        throwError(ErrorKind::kInvalidArgument, "smddp: " + describe(k) + ": " + text);
      }
    }
  } catch (...) {
    broken_ = true;
    for (auto& l : links_) close(l.fd);
    links_.clear();
    throw;
  }
}

ServerLinks::~ServerLinks() {
  ServerFrame bye;
  bye.kind = static_cast<uint8_t>(ServerFrameKind::kBye);
  for (auto& l : links_) {
    // A frame half sent would swallow the goodbye: only between frames.
    if (!broken_ && abandoned_.empty() && l.out.empty()) {
      writeAllBefore(l.fd, &bye, sizeof(bye), Clock::now() + std::chrono::milliseconds(200));
    }
    close(l.fd);
  }
}

void ServerLinks::fail(int k, const std::string& given, const std::string& during) {
  broken_ = true;
  const auto silence = PeerMonitor::configuredSilence().count() / 1000.0;
  char text[192];
  snprintf(text, sizeof(text),
           "silent: nothing sent to it was acknowledged for %.1f s (SMDDP_PEER_TIMEOUT %.1f s; "
           "link down, host down or stopped)", silence, silence);
  const std::string why = given == "silent" ? std::string(text) : given;
  // A wait that ran out is a timeout (the group's desync report follows);
  // anything else means the server is gone or broke the protocol.
  const ErrorKind kind = why == "timed out" ? ErrorKind::kTimeout : ErrorKind::kPeerLost;
  throwError(kind, "smddp: " + describe(k) + ": " + why + " (" + during + ")");
}

uint64_t ServerLinks::post(int k, const ServerFrame& f, const void* data, void* dst) {
  if (!abandoned_.empty()) {
    throwError(ErrorKind::kPeerLost, "smddp: " + describe(k) + ": " + abandoned_);
  }
  Link& l = links_[k];
  l.out.push_back({f, static_cast<const uint8_t*>(data), 0});
  l.expect.push_back({f, static_cast<uint8_t*>(dst)});
  send(k);
  return l.posted++;
}

bool ServerLinks::send(int k) {
  Link& l = links_[k];
  bool moved = false;
  while (!l.out.empty()) {
    Link::Out& o = l.out.front();
    constexpr uint64_t kHeader = sizeof(ServerFrame);
    iovec iov[2];
    int n = 0;
    if (o.sent < kHeader) {
      iov[n++] = {reinterpret_cast<uint8_t*>(&o.header) + o.sent, kHeader - o.sent};
      if (o.header.payload) iov[n++] = {const_cast<uint8_t*>(o.data), o.header.payload};
    } else {
      iov[n++] = {const_cast<uint8_t*>(o.data) + (o.sent - kHeader),
                  o.header.payload - (o.sent - kHeader)};
    }
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = n;
    const ssize_t got = ::sendmsg(l.fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      // ETIMEDOUT: unacknowledged past TCP_USER_TIMEOUT (boundSilence).
      fail(k, errno == ETIMEDOUT ? "silent" : "closed its connection: the server died or was stopped",
           "sending step " + std::to_string(o.header.step) + " of seq " + std::to_string(o.header.seq));
    }
    moved = moved || got > 0;
    o.sent += static_cast<uint64_t>(got);
    if (o.sent < kHeader + o.header.payload) break;  // the socket is full
    l.out.pop_front();
  }
  return moved;
}

bool ServerLinks::receive(int k) {
  Link& l = links_[k];
  constexpr uint64_t kHeader = sizeof(ServerFrame);
  auto during = [&l] {
    return l.expect.empty() ? std::string("between steps")
                            : "waiting for step " + std::to_string(l.expect.front().sent.step) +
                                  " of seq " + std::to_string(l.expect.front().sent.seq);
  };
  bool moved = false;
  while (true) {
    uint8_t* dst;
    uint64_t want;
    if (l.inGot < kHeader) {
      dst = reinterpret_cast<uint8_t*>(&l.in) + l.inGot;
      want = kHeader - l.inGot;
    } else {
      dst = l.expect.front().dst + (l.inGot - kHeader);
      want = l.in.payload - (l.inGot - kHeader);
    }
    if (want) {
      const ssize_t got = ::recv(l.fd, dst, want, MSG_DONTWAIT);
      if (got == 0) fail(k, "closed its connection: the server died or was stopped", during());
      if (got < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return moved;
        fail(k, errno == ETIMEDOUT ? "silent" : "closed its connection: the server died or was stopped",
             during());
      }
      moved = true;
      l.inGot += static_cast<uint64_t>(got);
      if (l.inGot < kHeader) continue;
    }
    if (l.inGot == kHeader) {
      std::string why = validateServerFrame(l.in, {ServerFrameKind::kResult, ServerFrameKind::kError});
      if (!why.empty()) fail(k, "sent " + why, during());
      if (l.in.kind == static_cast<uint8_t>(ServerFrameKind::kError)) {
        std::string text(l.in.payload, '\0');
        readAllBefore(l.fd, text.data(), text.size(), Clock::now() + std::chrono::seconds(1));
        broken_ = true;
        throwError(ErrorKind::kPeerLost, "smddp: " + describe(k) + " failed the job: " + text +
                                             " (" + during() + ")");
      }
      if (l.expect.empty()) fail(k, "sent a result nobody asked for", during());
      why = samePiece(l.expect.front().sent, l.in);
      if (!why.empty()) fail(k, "returned another piece: " + why, during());
    }
    if (l.inGot == kHeader + l.in.payload) {
      l.expect.pop_front();
      l.inGot = 0;
      ++l.received;
    }
  }
}

bool ServerLinks::progress() {
  bool moved = false;
  for (int k = 0; k < count(); ++k) {
    // Reading first frees the server to read on: it may be blocked
    // sending this worker an earlier result.
    if (!links_[k].expect.empty()) moved = receive(k) || moved;
    if (!links_[k].out.empty()) moved = send(k) || moved;
  }
  return moved;
}

void ServerLinks::wait(int k, uint64_t ticket, std::chrono::steady_clock::time_point deadline,
                       const WaitCheck& stop) {
  while (true) {
    progress();
    if (received(k, ticket)) return;
    const auto now = Clock::now();
    const Link& l = links_[k];
    const uint64_t i = ticket - l.received;  // ticket >= received here
    const std::string during =
        i < l.expect.size() ? "waiting for step " + std::to_string(l.expect[i].sent.step) +
                                  " of seq " + std::to_string(l.expect[i].sent.seq)
                            : "waiting for a result";
    if (now >= deadline) fail(k, "timed out", during);
    if (stop) {
      std::string why = stop();
      if (!why.empty()) fail(k, why, during);
    }
    std::vector<pollfd> p;
    for (auto& l : links_) {
      p.push_back({l.fd, static_cast<short>((l.expect.empty() ? 0 : POLLIN) |
                                            (l.out.empty() ? 0 : POLLOUT)), 0});
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
    ::poll(p.data(), p.size(), static_cast<int>(std::min<int64_t>(100, left + 1)));
  }
}

std::string ServerLinks::waitingOn() const {
  std::string out;
  for (int k = 0; k < count(); ++k) {
    const Link& l = links_[k];
    if (l.expect.empty()) continue;
    if (!out.empty()) out += "; ";
    out += describe(k) + ": " + std::to_string(l.expect.size()) + " result(s), the first for step " +
           std::to_string(l.expect.front().sent.step) + " of seq " +
           std::to_string(l.expect.front().sent.seq) +
           (l.out.empty() ? std::string() : ", " + std::to_string(l.out.size()) + " frame(s) unsent");
  }
  return out;
}

void ServerLinks::abandon(const std::string& why) {
  bool pending = false;
  for (auto& l : links_) pending = pending || !l.expect.empty() || !l.out.empty() || l.inGot;
  if (!pending) return;
  for (auto& l : links_) {
    l.out.clear();
    l.expect.clear();
    l.inGot = 0;
  }
  abandoned_ = "out of step since " + why;
}

}  // namespace smddp
