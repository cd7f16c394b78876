#include "server/server_link.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>

#include "common/error.h"
#include "transport/peer_monitor.h"
#include "transport/socket_address.h"

namespace smddp {

namespace {

using Clock = std::chrono::steady_clock;

// Servers that failed during a step in this process ("host:port").
std::mutex gDownMu;
std::set<std::string> gDown;  // guarded by gDownMu

std::string addressKey(const ServerAddress& a) { return a.host + ":" + std::to_string(a.port); }

void setDown(const ServerAddress& a, bool down) {
  std::lock_guard<std::mutex> lock(gDownMu);
  if (down) gDown.insert(addressKey(a));
  else gDown.erase(addressKey(a));
}

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

// A goodbye (kBye) to a server between frames: it ends this host's part
// of the stream without an error.
void sayGoodbye(int fd) {
  ServerFrame bye;
  bye.kind = static_cast<uint8_t>(ServerFrameKind::kBye);
  writeAllBefore(fd, &bye, sizeof(bye), std::chrono::steady_clock::now() +
                                            std::chrono::milliseconds(200));
}

std::string describeServer(const ServerAddress& s, const std::string& ip, int i) {
  std::string at = s.host + ":" + std::to_string(s.port);
  if (!ip.empty() && ip != s.host) at += " = " + ip;
  return "standalone reduction server " + std::to_string(i) + " (" + at + ", SMDDP_SERVER_HOSTS[" +
         std::to_string(i) + "])";
}

}  // namespace

std::string ServerLinks::describe(int k) const {
  const int i = listed_[k];
  return describeServer(servers_[i], ips_[i], i);
}

bool ServerLinks::knownDown(const ServerAddress& server) {
  std::lock_guard<std::mutex> lock(gDownMu);
  return gDown.count(addressKey(server)) > 0;
}

ServerLinks::ServerLinks(const std::vector<ServerAddress>& servers, const Identity& me,
                         std::chrono::milliseconds wait, const std::vector<bool>& quick)
    : servers_(servers), ips_(servers.size()), unreachable_(servers.size()) {
  const auto deadline = Clock::now() + wait;
  try {
    for (int i = 0; i < static_cast<int>(servers.size()); ++i) {
      const bool once = i < static_cast<int>(quick.size()) && quick[i];
      connectTo(i, me, once ? Clock::now() : deadline);
      if (unreachable_[i].empty()) setDown(servers[i], false);  // back, or never gone
    }
  } catch (...) {
    broken_ = true;
    for (auto& l : links_) close(l.fd);
    links_.clear();
    listed_.clear();
    throw;
  }
}

void ServerLinks::connectTo(int i, const Identity& me, Clock::time_point deadline) {
  using std::chrono::seconds;
  const auto& servers = servers_;
  std::string why;
  ips_[i] = resolve(servers[i].host, &why);
  auto unreachable = [&](const std::string& what) {
    unreachable_[i] = describeServer(servers[i], ips_[i], i) + ": " + what;
  };
  if (ips_[i].empty()) return unreachable(why);
  int fd = connectBefore("", ips_[i], servers[i].port, std::max(deadline, Clock::now() + seconds(1)),
                         &why);
  if (fd < 0) return unreachable("cannot connect: " + why);
  // A server host that goes silent (link or host down) fails the
  // pending push or pull within SMDDP_PEER_TIMEOUT, not the group's.
  boundSilence(fd, PeerMonitor::configuredSilence());
  const auto answerBy = std::max(deadline, Clock::now() + seconds(5));
  ServerFrame hello;
  hello.kind = static_cast<uint8_t>(ServerFrameKind::kHello);
  hello.secret = me.secret;
  hello.seq = static_cast<uint64_t>(me.rank);
  hello.hosts = static_cast<uint16_t>(me.hosts);
  hello.host = static_cast<uint16_t>(me.host);
  hello.stream = static_cast<uint16_t>(me.stream);
  hello.server = static_cast<uint16_t>(i);
  why = writeTextFrame(fd, hello, me.job, answerBy);
  ServerFrame answer;
  if (why.empty()) {
    why = readAllBefore(fd, &answer, sizeof(answer), answerBy);
    if (!why.empty()) why = "no welcome: " + why;
  } else {
    why = "hello: " + why;
  }
  if (!why.empty()) {
    close(fd);
    return unreachable(why);
  }
  why = validateServerFrame(answer, {ServerFrameKind::kWelcome, ServerFrameKind::kError});
  std::string refusal;
  if (!why.empty()) {
    refusal = "answered the hello with " + why;
  } else if (answer.kind == static_cast<uint8_t>(ServerFrameKind::kError)) {
    refusal.assign(answer.payload, '\0');
    readAllBefore(fd, refusal.data(), refusal.size(), Clock::now() + seconds(1));
  }
  if (!refusal.empty()) {
    close(fd);
    throwError(ErrorKind::kInvalidArgument,
               "smddp: " + describeServer(servers[i], ips_[i], i) + ": " + refusal);
  }
  links_.emplace_back();
  links_.back().fd = fd;
  listed_.push_back(i);
}

void ServerLinks::keep(const std::vector<bool>& live) {
  SMDDP_CHECK(live.size() == servers_.size(), kInternal, "ServerLinks::keep: one flag per server");
  for (size_t i = 0; i < live.size(); ++i) {
    SMDDP_CHECK(!live[i] || unreachable_[i].empty(), kInternal,
                "ServerLinks::keep: a server this rank did not reach is marked live");
  }
  std::vector<Link> kept;
  std::vector<int> listed;
  for (size_t k = 0; k < links_.size(); ++k) {
    if (live[listed_[k]]) {
      kept.push_back(std::move(links_[k]));
      listed.push_back(listed_[k]);
      continue;
    }
    sayGoodbye(links_[k].fd);
    close(links_[k].fd);
  }
  links_ = std::move(kept);
  listed_ = std::move(listed);
}

ServerLinks::~ServerLinks() {
  for (auto& l : links_) {
    // A frame half sent would swallow the goodbye: only between frames.
    if (!broken_ && abandoned_.empty() && l.out.empty()) sayGoodbye(l.fd);
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
  if (kind == ErrorKind::kPeerLost && k >= 0 && k < static_cast<int>(listed_.size())) {
    setDown(servers_[listed_[k]], true);  // the next group of this process tries it once
  }
  throwError(kind, "smddp: " + describe(k) + ": " + why + " (" + during + ")");
}

uint64_t ServerLinks::post(int k, const ServerFrame& f, const void* data, void* dst) {
  if (!abandoned_.empty()) {
    throwError(ErrorKind::kPeerLost, "smddp: " + describe(k) + ": " + abandoned_);
  }
  Link& l = links_[k];
  l.out.push(f, data);
  l.expect.push_back({f, static_cast<uint8_t*>(dst)});
  send(k);
  return l.posted++;
}

namespace {

// What fail() says for a FrameReader/FrameWriter failure.
std::string connectionLost(const std::string& why) {
  if (why == "silent") return why;  // fail() spells it out
  const std::string gone = "closed its connection: the server died or was stopped";
  return why == "closed" ? gone : gone + " (" + why + ")";
}

}  // namespace

bool ServerLinks::send(int k) {
  Link& l = links_[k];
  const uint64_t before = l.out.bytes();
  std::string why;
  while (!l.out.empty()) {
    const ServerFrame& f = l.out.front();
    const FrameIo io = l.out.write(l.fd, &why);
    if (io == FrameIo::kFailed) {
      // A server that closed may have said why first (say, another host
      // left): its error frame names the cause better than a broken pipe.
      if (why != "silent") receive(k);
      fail(k, connectionLost(why),
           "sending step " + std::to_string(f.step) + " of seq " + std::to_string(f.seq));
    }
    if (io != FrameIo::kDone) break;  // the socket is full
    l.out.pop();
  }
  return l.out.bytes() != before;
}

bool ServerLinks::receive(int k) {
  Link& l = links_[k];
  auto during = [&l] {
    return l.expect.empty() ? std::string("between steps")
                            : "waiting for step " + std::to_string(l.expect.front().sent.step) +
                                  " of seq " + std::to_string(l.expect.front().sent.seq);
  };
  const uint64_t before = l.in.bytes();
  std::string why;
  while (true) {
    const FrameIo io = l.in.read(l.fd, &why);
    if (io == FrameIo::kAgain) return l.in.bytes() != before;
    if (io == FrameIo::kFailed) {
      fail(k, connectionLost(why), during());
    }
    const ServerFrame& f = l.in.header();
    if (io == FrameIo::kHeader) {
      why = validateServerFrame(f, {ServerFrameKind::kResult, ServerFrameKind::kError});
      if (!why.empty()) fail(k, "sent " + why, during());
      if (f.kind == static_cast<uint8_t>(ServerFrameKind::kError)) {
        std::string text(f.payload, '\0');
        readAllBefore(l.fd, text.data(), text.size(), Clock::now() + std::chrono::seconds(1));
        broken_ = true;
        throwError(ErrorKind::kPeerLost, "smddp: " + describe(k) + " failed the job: " + text +
                                             " (" + during() + ")");
      }
      if (l.expect.empty()) fail(k, "sent a result nobody asked for", during());
      why = samePiece(l.expect.front().sent, f);
      if (!why.empty()) fail(k, "returned another piece: " + why, during());
      l.in.payloadTo(l.expect.front().dst);
      continue;
    }
    l.expect.pop_front();  // kDone
    l.in.next();
    ++l.received;
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
  for (auto& l : links_) pending = pending || !l.expect.empty() || !l.out.empty() || !l.in.idle();
  if (!pending) return;
  for (auto& l : links_) {
    l.out.clear();
    l.expect.clear();
    l.in.next();
  }
  abandoned_ = "out of step since " + why;
}

namespace {

std::string oneLine(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

}  // namespace

std::string reachStatus(const std::string& error, const std::vector<std::string>& unreachable,
                        int servers) {
  std::string out = error.empty() ? "ok" : "error " + oneLine(error);
  for (int i = 0; i < servers; ++i) {
    out += '\n';
    if (i < static_cast<int>(unreachable.size())) out += oneLine(unreachable[i]);
  }
  return out;
}

int ServerVerdict::inUse() const {
  return static_cast<int>(std::count(live.begin(), live.end(), true));
}

ServerVerdict agreeOnServers(const std::vector<std::string>& statuses, int servers, bool required) {
  ServerVerdict v;
  v.live.assign(servers, true);
  v.why.assign(servers, "");
  const std::string head = " cannot use the standalone reduction servers (SMDDP_SERVER_HOSTS): ";
  for (size_t r = 0; r < statuses.size(); ++r) {
    std::vector<std::string> lines;
    size_t at = 0;
    while (true) {
      const size_t nl = statuses[r].find('\n', at);
      lines.push_back(statuses[r].substr(at, nl == std::string::npos ? nl : nl - at));
      if (nl == std::string::npos) break;
      at = nl + 1;
    }
    const std::string rank = "rank " + std::to_string(r);
    if (static_cast<int>(lines.size()) != servers + 1 ||
        (lines[0] != "ok" && lines[0].rfind("error ", 0) != 0)) {
      if (v.error.empty()) v.error = "smddp: " + rank + head + "its report is malformed";
      continue;
    }
    if (lines[0] != "ok" && v.error.empty()) v.error = "smddp: " + rank + head + lines[0].substr(6);
    for (int i = 0; i < servers; ++i) {
      if (lines[i + 1].empty()) continue;
      v.live[i] = false;
      v.why[i] += (v.why[i].empty() ? "" : "; ") + rank + ": " + lines[i + 1];
    }
  }
  if (v.error.empty() && required) {
    for (int i = 0; i < servers; ++i) {
      if (v.live[i]) continue;
      v.error = "smddp: " + v.why[i] + " (SMDDP_SERVER_REQUIRED=1: the group does not go on "
                "without it)";
      break;
    }
  }
  return v;
}

}  // namespace smddp
