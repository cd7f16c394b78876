#include "engine/server_link.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

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
      fds_.push_back(fd);
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
    for (int fd : fds_) close(fd);
    fds_.clear();
    throw;
  }
}

ServerLinks::~ServerLinks() {
  ServerFrame bye;
  bye.kind = static_cast<uint8_t>(ServerFrameKind::kBye);
  for (int fd : fds_) {
    if (!broken_) writeAllBefore(fd, &bye, sizeof(bye), Clock::now() + std::chrono::milliseconds(200));
    close(fd);
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

void ServerLinks::push(int k, const ServerFrame& f, const void* data,
                       std::chrono::steady_clock::time_point deadline, const WaitCheck& stop) {
  std::string why = writeAllBefore(fds_[k], &f, sizeof(f), deadline, stop);
  if (why.empty() && f.payload) why = writeAllBefore(fds_[k], data, f.payload, deadline, stop);
  if (why == "closed") why = "closed its connection: the server died or was stopped";
  if (!why.empty()) fail(k, why, "sending step " + std::to_string(f.step) + " of seq " + std::to_string(f.seq));
}

void ServerLinks::pull(int k, const ServerFrame& sent, void* dst,
                       std::chrono::steady_clock::time_point deadline, const WaitCheck& stop) {
  const std::string during = "waiting for step " + std::to_string(sent.step) + " of seq " +
                             std::to_string(sent.seq);
  ServerFrame r;
  std::string why = readAllBefore(fds_[k], &r, sizeof(r), deadline, stop);
  if (why == "closed") why = "closed its connection: the server died or was stopped";
  if (!why.empty()) fail(k, why, during);
  why = validateServerFrame(r, {ServerFrameKind::kResult, ServerFrameKind::kError});
  if (!why.empty()) fail(k, "sent " + why, during);
  if (r.kind == static_cast<uint8_t>(ServerFrameKind::kError)) {
    std::string text(r.payload, '\0');
    readAllBefore(fds_[k], text.data(), text.size(), Clock::now() + std::chrono::seconds(1));
    broken_ = true;
    throwError(ErrorKind::kPeerLost, "smddp: " + describe(k) + " failed the job: " + text +
                                         " (" + during + ")");
  }
  why = samePiece(sent, r);
  if (!why.empty()) fail(k, "returned another piece: " + why, during);
  why = readAllBefore(fds_[k], dst, r.payload, deadline, stop);
  if (why == "closed") why = "closed its connection: the server died or was stopped";
  if (!why.empty()) fail(k, why, during);
}

}  // namespace smddp
