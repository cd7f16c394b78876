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
void sayGoodbye(int fd, FrameSeal* seal, uint64_t group) {
  ServerFrame bye;
  bye.kind = static_cast<uint8_t>(ServerFrameKind::kBye);
  bye.group = group;
  writeTextFrame(fd, bye, "", std::chrono::steady_clock::now() + std::chrono::milliseconds(200),
                 seal);
}

std::string describeServer(const ServerAddress& s, const std::string& ip, int i) {
  std::string at = s.host + ":" + std::to_string(s.port);
  if (!ip.empty() && ip != s.host) at += " = " + ip;
  if (!s.origin.empty()) at += ", " + s.origin;
  return "standalone reduction server " + std::to_string(i) + " (" + at + ")";
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
    : servers_(servers), ips_(servers.size()), unreachable_(servers.size()), group_(me.group) {
  const auto deadline = Clock::now() + wait;
  try {
    for (int i = 0; i < static_cast<int>(servers.size()); ++i) {
      const bool once = i < static_cast<int>(quick.size()) && quick[i];
      connectTo(i, me, once ? Clock::now() : deadline);
      if (unreachable_[i].empty()) setDown(servers[i], false);  // back, or never gone
    }
  } catch (...) {
    broken_ = true;
    links_.clear();  // closes every socket
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
  Link l;
  l.fd = UniqueFd(fd);
  why = handshake(i, me, l, std::max(deadline, Clock::now() + seconds(5)));
  if (!why.empty()) return unreachable(why);  // l's socket closes
  links_.push_back(std::move(l));
  listed_.push_back(i);
}

namespace {

// What a server that has not proved it holds the key says, fit for a log:
// anyone who can answer a connection may write it, so it is cut short and
// holds printable ASCII only (no escapes, no forged log lines).
std::string unprovenText(const std::string& text) {
  constexpr size_t kMost = 120;
  std::string out;
  for (size_t i = 0; i < text.size() && i < kMost; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    out += c >= 0x20 && c < 0x7f ? static_cast<char>(c) : '?';
  }
  if (text.size() > kMost) out += "... (" + std::to_string(text.size() - kMost) + " more bytes)";
  return out;
}

// This worker's hello to server `server`: who it is (group, rank, host of
// hosts, stream), its largest piece, how long it waits for the welcome,
// and the wire it asks for (encryption implies integrity: GCM's tag is the
// MAC).
ServerFrame helloFrame(const ServerLinks::Identity& me, int server,
                       std::chrono::steady_clock::time_point answerBy) {
  ServerFrame hello;
  hello.kind = static_cast<uint8_t>(ServerFrameKind::kHello);
  hello.flags = me.encrypt ? kServerFlagIntegrity | kServerFlagEncrypt
                           : (me.integrity ? kServerFlagIntegrity : 0);
  hello.group = me.group;
  hello.seq = static_cast<uint64_t>(me.rank);
  hello.step = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                         answerBy - std::chrono::steady_clock::now())
                                         .count());
  hello.count = me.maxPiece;
  hello.hosts = static_cast<uint16_t>(me.hosts);
  hello.host = static_cast<uint16_t>(me.host);
  hello.stream = static_cast<uint16_t>(me.stream);
  hello.server = static_cast<uint16_t>(server);
  hello.payload = kServerProofBytes + me.job.size();
  return hello;
}

// A server whose answer did not prove it (`why`: what was wrong with the
// answer itself, or "" for a proof that does not check).
[[noreturn]] void failedAuthentication(const std::string& name, const std::string& why,
                                       const std::string& dialled, const std::string& job) {
  throwError(ErrorKind::kInvalidArgument,
             "smddp: " + name + " failed authentication: " +
                 (why.empty() ? std::string("its answer does not prove it holds the key")
                              : "it answered the challenge with " + why) +
                 " for " + dialled + " and job '" + job +
                 "' (a relay or a name that leads elsewhere, a server of another job, a "
                 "server of another key, or not a reduction server: nothing was sent to it; "
                 "SMDDP_SERVER_JOB, SMDDP_SERVER_KEY_FILE or the key in the store it "
                 "registered in, and the server's --advertise)");
}

}  // namespace

std::string ServerLinks::handshake(int i, const Identity& me, Link& l,
                                   Clock::time_point answerBy) {
  const std::string name = describeServer(servers_[i], ips_[i], i);
  // 1. The challenge: a fresh nonce, an ephemeral X25519 share, the
  //    address this worker dialled (the one its socket reached, whatever
  //    name led there) and its job id.
  //    The server must prove itself as that server of that job: a relay
  //    that forwards this challenge to the real server gets back a proof
  //    for the real server's address, which fails below.
  const Nonce mine = Nonce::random();
  const X25519KeyPair share = x25519KeyPair();
  const std::string dialled = socketEndpoint(l.fd.get(), /*local=*/false);
  if (dialled.empty() || dialled.size() > kServerMaxAddress) {
    return "cannot tell the address its socket reached";
  }
  SMDDP_CHECK(me.job.size() <= kServerMaxJob, kInvalidArgument,
              "SMDDP_SERVER_JOB is " + std::to_string(me.job.size()) + " bytes long (at most " +
                  std::to_string(kServerMaxJob) + ")");
  ServerFrame challenge;
  challenge.kind = static_cast<uint8_t>(ServerFrameKind::kChallenge);
  challenge.count = dialled.size();
  std::string why = writeTextFrame(
      l.fd.get(), challenge,
      std::string(bytesOf(mine.bytes, kNonceBytes)) + share.publicKey + dialled + me.job, answerBy);
  if (!why.empty()) return "challenge: " + why;
  // 2. Its answer must prove it holds the key before it hears anything
  //    more. A refusal before that (busy) is unproven: the server is left
  //    out, never believed further.
  std::string answer;
  FrameReader reader;
  why = readFrameBefore(l.fd.get(), reader, {ServerFrameKind::kAnswer, ServerFrameKind::kError},
                        kServerMaxText, &answer, answerBy);
  if (why == "closed" || why == "silent" || why == "timed out") return "no answer: " + why;
  if (why.empty() && reader.header().kind == static_cast<uint8_t>(ServerFrameKind::kError)) {
    return "refused the connection before proving itself, saying (unauthenticated): \"" +
           unprovenText(answer) + "\"";
  }
  Nonce theirs;
  std::string theirShare;
  if (why.empty()) {
    std::memcpy(theirs.bytes, answer.data(), kNonceBytes);
    theirShare = answer.substr(kNonceBytes, kServerShareBytes);
  }
  const std::string identity = serverIdentityKey(me.key, me.job, dialled);
  const Handshake proofs(identity, mine, theirs, share.publicKey, theirShare);
  const auto* proofBytes =
      reinterpret_cast<const uint8_t*>(answer.data()) + kNonceBytes + kServerShareBytes;
  if (!why.empty() || !macEquals(proofs.serverProof(), proofBytes)) {
    failedAuthentication(name, why, dialled, me.job);
  }
  // 3. The hello, vouched for by this worker's proof, then its answer.
  const ServerFrame hello = helloFrame(me, i, answerBy);
  const Mac proof = proofs.workerProof(hello, me.job);
  why = writeTextFrame(l.fd.get(), hello, std::string(bytesOf(proof.bytes, kMacBytes)) + me.job,
                       answerBy);
  if (!why.empty()) return "hello: " + why;
  if (hello.flags & kServerFlagIntegrity) {
    // A proved share (the proof covers it) that is still a low-order point
    // could only come from a server holding the key: refused all the same.
    std::string shared = x25519SharedSecret(share.privateKey, theirShare, name + "'s answer");
    const std::string session = proofs.sessionKey(shared);
    wipe(shared);
    l.seal = std::make_unique<FrameSeal>(session, SealDirection::kToServer, me.encrypt);
    l.check = std::make_unique<FrameSeal>(session, SealDirection::kToWorker, me.encrypt);
    l.out.sealWith(l.seal.get());
    l.in.checkWith(l.check.get());
  }
  return welcome(l, name, me.encrypt, answerBy);
}

std::string ServerLinks::welcome(Link& l, const std::string& name, bool encrypt,
                                 Clock::time_point answerBy) {
  std::string text;
  const std::string why =
      readFrameBefore(l.fd.get(), l.in, {ServerFrameKind::kWelcome, ServerFrameKind::kError},
                      kServerMaxText, &text, answerBy);
  if (why == "closed" || why == "silent" || why == "timed out") return "no welcome: " + why;
  std::string refusal;
  if (!why.empty()) refusal = "answered the hello with " + why;
  else if (l.in.header().kind == static_cast<uint8_t>(ServerFrameKind::kError)) refusal = text;
  else if (encrypt && !(l.in.header().flags & kServerFlagEncrypt)) {
    refusal = "welcomed this worker without confirming SMDDP_WIRE_ENCRYPT=1 (a server that "
              "does not encrypt: set it on the server too)";
  }
  if (!refusal.empty()) throwError(ErrorKind::kInvalidArgument, "smddp: " + name + ": " + refusal);
  return "";
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
    sayGoodbye(links_[k].fd.get(), links_[k].seal.get(), group_);
  }
  links_ = std::move(kept);
  listed_ = std::move(listed);
}

ServerLinks::~ServerLinks() {
  for (auto& l : links_) {
    // A frame half sent would swallow the goodbye: only between frames.
    if (!broken_ && abandoned_.empty() && l.out.empty()) {
      sayGoodbye(l.fd.get(), l.seal.get(), group_);
    }
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
  ServerFrame g = f;
  g.group = group_;
  l.out.push(g, data);
  l.expect.push_back({g, static_cast<uint8_t*>(dst)});
  send(k);
  return l.posted++;
}

namespace {

// What fail() says for a FrameReader/FrameWriter failure.
std::string connectionLost(const std::string& why) {
  if (why == "silent") return why;  // fail() spells it out
  if (why.rfind("a frame failed its integrity check", 0) == 0) return why;
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
    const FrameIo io = l.out.write(l.fd.get(), &why);
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
    const FrameIo io = l.in.read(l.fd.get(), &why);
    if (io == FrameIo::kAgain) return l.in.bytes() != before;
    if (io == FrameIo::kFailed) {
      fail(k, connectionLost(why), during());
    }
    const ServerFrame& f = l.in.header();
    const bool error = f.kind == static_cast<uint8_t>(ServerFrameKind::kError);
    if (io == FrameIo::kHeader) {
      why = validateServerFrame(f, {ServerFrameKind::kResult, ServerFrameKind::kError});
      if (!why.empty()) fail(k, "sent " + why, during());
      if (error) {
        l.errorText.assign(f.payload, '\0');  // at most kServerMaxText
        l.in.payloadTo(reinterpret_cast<uint8_t*>(l.errorText.data()));
        continue;
      }
      if (l.expect.empty()) fail(k, "sent a result nobody asked for", during());
      why = samePiece(l.expect.front().sent, f);
      if (!why.empty()) fail(k, "returned another piece: " + why, during());
      // A sealed result is the server's only once its tag checks: until
      // then its bytes must not touch the slot (the caller's tensor).
      if (l.check) {
        l.staged.resize(f.payload);
        l.in.payloadTo(l.staged.data());
      } else {
        l.in.payloadTo(l.expect.front().dst);
      }
      continue;
    }
    if (error) {  // kDone: its whole text is in
      broken_ = true;
      throwError(ErrorKind::kPeerLost, "smddp: " + describe(k) + " failed the job: " +
                                           l.errorText + " (" + during() + ")");
    }
    if (l.check && f.payload) std::memcpy(l.expect.front().dst, l.staged.data(), f.payload);
    l.expect.pop_front();
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
      p.push_back({l.fd.get(), static_cast<short>((l.expect.empty() ? 0 : POLLIN) |
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
