#include "transport/peer_monitor.h"

#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "common/error.h"
#include "common/logging.h"
#include "common/param.h"
#include "common/thread_name.h"
#include "transport/liveness_message.h"
#include "transport/socket_address.h"

namespace smddp {

using namespace liveness;

SMDDP_PARAM_INT(paramPeerTimeout, "SMDDP_PEER_TIMEOUT", 10, 0, 86400,
                "seconds without a heartbeat after which a peer's host counts as lost (ranks on "
                "other hosts only), and without an acknowledgement after which a standalone "
                "reduction server's connection fails; 0 = no liveness connections, and no bound on "
                "server connections but the group timeout")

namespace {

constexpr size_t kMaxOutbox = 4096;    // a peer this far behind gets no more beats
constexpr auto kMaxPollWait = std::chrono::milliseconds(100);

using Clock = std::chrono::steady_clock;

std::string secondsText(std::chrono::milliseconds d) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.1f s", static_cast<double>(d.count()) / 1000.0);
  return b;
}

// Every live monitor of this process: its goodbye is said when the process
// exits normally (a rank that returns from main without destroying its
// group is not dead to its peers), and a forked child closes its copies of
// the sockets (else the parent's death would go unseen while it lived).
// Leaked on purpose: monitors may outlive static destructors.
struct Registry {
  std::mutex mu;
  std::vector<PeerMonitor*> live;  // guarded by mu
};
Registry& registry() {
  static Registry* r = std::make_unique<Registry>().release();
  return *r;
}
void goodbyeAtExit() {
  std::lock_guard<std::mutex> lock(registry().mu);
  for (PeerMonitor* m : registry().live) m->sayGoodbye();
}
void forkPrepare() { registry().mu.lock(); }
void forkParent() { registry().mu.unlock(); }
void forkChild() {
  for (PeerMonitor* m : registry().live) m->closeInForkedChild();
  registry().live.clear();
  registry().mu.unlock();
}
void registerOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    std::atexit(goodbyeAtExit);
    pthread_atfork(forkPrepare, forkParent, forkChild);
  });
}

}  // namespace

std::string hostDisplayName(const std::string& identity) {
  // hostIdentity (communicator.cc) appends "/" and the 36-character boot id.
  const size_t slash = identity.rfind('/');
  if (slash != std::string::npos && identity.size() - slash - 1 == 36) {
    return identity.substr(0, slash);
  }
  return identity;
}

std::chrono::milliseconds PeerMonitor::configuredSilence() {
  return std::chrono::seconds(paramPeerTimeout());
}

std::unique_ptr<PeerMonitor> PeerMonitor::open(Bootstrap& bootstrap, PeerMonitorOptions opts) {
  SMDDP_CHECK(static_cast<int>(opts.hosts.size()) == opts.size, kInternal,
              "PeerMonitor: one host per rank");
  const bool on = opts.silence.count() > 0;
  SMDDP_CHECK(!on || (opts.keys && opts.keys->size() == opts.size), kInternal,
              "PeerMonitor: the group's pair keys are missing");
  if (opts.address.empty()) opts.address = fallbackAddress();
  int listenFd = -1, port = 0;
  if (on) listenFd = listenOn(opts.address, &port);
  // Published after listen(): a peer that reads this address can connect.
  std::vector<std::string> all;
  try {
    all = bootstrapAllGather(bootstrap, opts.rank, opts.size, "liveness",
                             on ? opts.address + " " + std::to_string(port) + " " +
                                      std::to_string(opts.silence.count())
                                : "-",
                             opts.setupTimeout);
  } catch (...) {
    if (listenFd >= 0) close(listenFd);  // not yet the monitor's
    throw;
  }
  if (!on) return nullptr;
  std::vector<std::string> addresses(opts.size);
  std::vector<int> ports(opts.size, 0);
  // Beats come often enough for the most impatient rank of the group
  // (SMDDP_PEER_TIMEOUT may differ between ranks).
  std::chrono::milliseconds shortest = opts.silence;
  for (int r = 0; r < opts.size; ++r) {
    std::istringstream f(all[r]);
    int64_t silenceMs = 0;
    f >> addresses[r] >> ports[r] >> silenceMs;
    if (addresses[r] == "-" || ports[r] <= 0) addresses[r].clear();
    if (silenceMs > 0) shortest = std::min(shortest, std::chrono::milliseconds(silenceMs));
  }
  opts.beatEvery = std::clamp(shortest / 5, std::chrono::milliseconds(50),
                              std::chrono::milliseconds(1000));
  registerOnce();
  auto m = std::make_unique<PeerMonitor>(std::move(opts), listenFd, std::move(addresses),
                                         std::move(ports));
  m->connectToLowerPeers();
  m->thread_ = std::thread([p = m.get()] {
    smddp::nameThisThread("smddp-liveness");
    p->run();
  });
  {
    std::lock_guard<std::mutex> lock(registry().mu);
    registry().live.push_back(m.get());
  }
  return m;
}

PeerMonitor::PeerMonitor(PeerMonitorOptions opts, int listenFd, std::vector<std::string> addresses,
                         std::vector<int> ports)
    : opts_(std::move(opts)), addresses_(std::move(addresses)), ports_(std::move(ports)),
      listenFd_(UniqueFd(listenFd)), creatorPid_(getpid()), links_(opts_.size), lost_(opts_.size, 0) {
  beatEvery_ = opts_.beatEvery;
  sockaddr_storage sa{};
  socklen_t len = sizeof(sa);
  if (getsockname(listenFd_.get(), reinterpret_cast<sockaddr*>(&sa), &len) == 0) {
    listenPort_ = ntohs(sa.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&sa)->sin6_port
                                                 : reinterpret_cast<sockaddr_in*>(&sa)->sin_port);
  }
  wakeFd_ = UniqueFd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  started_ = Clock::now();
  nextBeat_ = started_ + beatEvery_;
  const std::string& mine = opts_.hosts[opts_.rank];
  for (int p = 0; p < opts_.size; ++p) {
    Link& l = links_[p];
    l.watched = p != opts_.rank && opts_.hosts[p] != mine && !addresses_[p].empty();
    l.lastHeard = started_;
  }
}

void PeerMonitor::connectToLowerPeers() {
  // Each pair has one connection: the higher rank connects, and says hello
  // first; the lower one answers with its own once it has checked it.
  const auto deadline = Clock::now() + opts_.setupTimeout;
  for (int p = 0; p < opts_.rank; ++p) {
    if (!links_[p].watched) continue;
    std::string why;
    int fd = connectBefore(opts_.address, addresses_[p], ports_[p], deadline, &why);
    if (fd < 0) {
      for (auto& l : links_) l.fd.reset();
      listenFd_.reset();
      wakeFd_.reset();
      throwError(ErrorKind::kTransport, "smddp: cannot open the liveness connection to " +
                                            describe(p) + " (port " + std::to_string(ports_[p]) +
                                            "): " + why);
    }
    links_[p].fd = UniqueFd(fd);
    links_[p].lastHeard = Clock::now();
    queueLocked(p, kHello);
    flushLocked(p);
  }
}

PeerMonitor::~PeerMonitor() {
  if (getpid() != creatorPid_) {
    // A forked child: its sockets are closed (forkChild) and the thread
    // never existed here.
    if (thread_.joinable()) thread_.detach();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(registry().mu);
    auto& live = registry().live;
    live.erase(std::remove(live.begin(), live.end(), this), live.end());
  }
  stopThread();
  sayGoodbye();
  std::lock_guard<std::mutex> lock(ioMu_);
  closeSockets(/*drainFirst=*/true);
  wakeFd_.reset();
}

void PeerMonitor::stopThread() {
  stop_ = true;
  uint64_t one = 1;
  if (wakeFd_ && write(wakeFd_.get(), &one, sizeof(one)) < 0) {
  }
  if (thread_.joinable()) thread_.join();
}

void PeerMonitor::closeSockets(bool drainFirst) {
  for (auto& l : links_) {
    if (!l.fd) continue;
    if (drainFirst) {
      // Read what the peer sent first: closing over unread bytes resets the
      // connection, and a reset may overtake the goodbye.
      uint8_t sink[256];
      while (recv(l.fd.get(), sink, sizeof(sink), MSG_DONTWAIT) > 0) {
      }
    }
    l.fd.reset();
  }
  pending_.clear();
  listenFd_.reset();
}

void PeerMonitor::closeInForkedChild() {
  // Only this thread exists in the child; ioMu_ may be held by a thread
  // that did not survive the fork, so it is not taken.
  closeSockets(/*drainFirst=*/false);
  wakeFd_.reset();
}

void PeerMonitor::sayGoodbye() {
  std::lock_guard<std::mutex> lock(ioMu_);
  if (goodbyeSaid_) return;
  goodbyeSaid_ = true;
  for (int p = 0; p < opts_.size; ++p) {
    Link& l = links_[p];
    if (!l.fd) continue;
    queueLocked(p, kBye);
    flushLocked(p);
    if (l.fd) shutdown(l.fd.get(), SHUT_WR);
  }
}

bool PeerMonitor::leftBefore(uint64_t seq, int* rank, Clock::time_point* when) const {
  if (!anyLeft_.load()) return false;
  std::lock_guard<std::mutex> lock(ioMu_);
  for (int p = 0; p < opts_.size; ++p) {
    const Link& l = links_[p];
    if (l.departed && l.leftBefore <= seq) {
      *rank = p;
      *when = l.leftAt;
      return true;
    }
  }
  return false;
}

bool PeerMonitor::leftAt(int rank, Clock::time_point* when) const {
  if (!anyLeft_.load() || rank < 0 || rank >= opts_.size) return false;
  std::lock_guard<std::mutex> lock(ioMu_);
  if (!links_[rank].departed) return false;
  *when = links_[rank].leftAt;
  return true;
}

void PeerMonitor::dropWithoutGoodbye() {
  stopThread();
  std::lock_guard<std::mutex> lock(ioMu_);
  goodbyeSaid_ = true;  // nothing more is sent
  closeSockets(/*drainFirst=*/false);
}

void PeerMonitor::freezeForTest() {
  stopThread();
  std::lock_guard<std::mutex> lock(ioMu_);
  frozen_ = true;
  goodbyeSaid_ = true;  // a frozen process says nothing, not even goodbye
}

bool PeerMonitor::failed(PeerFailure* out) const {
  if (!failed_.load(std::memory_order_acquire)) return false;
  std::lock_guard<std::mutex> lock(failMu_);
  *out = failure_;
  return true;
}

bool PeerMonitor::lost(int rank) const {
  if (!failed_.load(std::memory_order_acquire)) return false;
  std::lock_guard<std::mutex> lock(failMu_);
  return rank >= 0 && rank < static_cast<int>(lost_.size()) && lost_[rank];
}

std::vector<int> PeerMonitor::watchedRanks() const {
  std::vector<int> out;
  for (int p = 0; p < opts_.size; ++p) {
    if (links_[p].watched) out.push_back(p);
  }
  return out;
}

std::string PeerMonitor::describe(int peer) const {
  std::string s = "rank " + std::to_string(peer) + " on host " +
                  hostDisplayName(opts_.hosts[peer]);
  if (!addresses_[peer].empty()) s += " (" + addresses_[peer] + ")";
  return s;
}

void PeerMonitor::fail(int peer, const char* what, const std::string& cause) {
  Link& l = links_[peer];
  if (l.reported) return;
  l.reported = true;
  std::lock_guard<std::mutex> lock(failMu_);
  lost_[peer] = 1;
  if (failed_.load()) return;
  failure_.rank = peer;
  failure_.who = describe(peer);
  failure_.what = what;
  failure_.cause = cause;
  failed_.store(true, std::memory_order_release);
  SMDDP_LOG(kWarn) << " [rank " << opts_.rank << "] " << failure_.who << " " << what << ": "
                   << cause;
}

void PeerMonitor::run() {
  std::vector<pollfd> fds;
  std::vector<PollSlot> slots;
  while (!stop_.load()) {
    fds.clear();
    slots.clear();
    fds.push_back({wakeFd_.get(), POLLIN, 0});
    slots.push_back({0, 0});
    {
      std::lock_guard<std::mutex> lock(ioMu_);
      if (listenFd_ && Clock::now() >= listenPauseUntil_) {
        fds.push_back({listenFd_.get(), POLLIN, 0});
        slots.push_back({1, 0});
      }
      for (size_t i = 0; i < pending_.size(); ++i) {
        fds.push_back({pending_[i].fd.get(), POLLIN, 0});
        slots.push_back({2, static_cast<int>(i)});
      }
      for (int p = 0; p < opts_.size; ++p) {
        const Link& l = links_[p];
        if (!l.fd) continue;
        fds.push_back({l.fd.get(), static_cast<short>(POLLIN | (l.tx.empty() ? 0 : POLLOUT)), 0});
        slots.push_back({3, p});
      }
    }
    const auto now = Clock::now();
    auto wait = std::min<Clock::duration>(kMaxPollWait, nextBeat_ > now ? nextBeat_ - now
                                                                          : Clock::duration(0));
    int n = poll(fds.data(), fds.size(),
                 static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(wait)
                                      .count()));
    if (stop_.load()) break;
    std::lock_guard<std::mutex> lock(ioMu_);
    if (goodbyeSaid_) continue;  // leaving: nothing more to watch or say
    if (n > 0) {
      // Pending connections are read before the listener adds to them (the
      // slots' indices stay valid), and in reverse (readPending erases).
      for (size_t i = fds.size(); i-- > 0;) {
        if (!fds[i].revents || slots[i].kind != 2) continue;
        readPendingLocked(static_cast<size_t>(slots[i].index));
      }
      for (size_t i = 0; i < fds.size(); ++i) {
        if (!fds[i].revents) continue;
        const int peer = slots[i].index;
        if (slots[i].kind == 0) {
          uint64_t v;
          if (read(wakeFd_.get(), &v, sizeof(v)) < 0) {
          }
        } else if (slots[i].kind == 1) {
          acceptLocked();
        } else if (slots[i].kind == 3 && links_[peer].fd.get() == fds[i].fd) {
          if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) readLinkLocked(peer);
          if (links_[peer].fd && (fds[i].revents & POLLOUT)) flushLocked(peer);
        }
      }
    }
    checkDeadlinesLocked(Clock::now());
  }
}

void PeerMonitor::queueLocked(int peer, uint8_t type) {
  Link& l = links_[peer];
  if (l.tx.size() + kMessageBytes > kMaxOutbox) return;  // not reading: its silence shows
  const uint64_t leftBefore =
      type == kBye && opts_.firstUnfinished ? opts_.firstUnfinished->load() : kNoCall;
  const Message m = sealedMessage(*opts_.keys, type, static_cast<uint32_t>(opts_.rank),
                                 static_cast<uint32_t>(peer), ++l.sent, leftBefore);
  l.tx.append(reinterpret_cast<const char*>(&m), sizeof(m));
}

void PeerMonitor::flushLocked(int peer) {
  Link& l = links_[peer];
  while (l.fd && !l.tx.empty()) {
    ssize_t n = send(l.fd.get(), l.tx.data(), l.tx.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      l.tx.erase(0, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n < 0 && errno == EINTR) continue;
    // EPIPE, ECONNRESET: the reader sees the same end (and any goodbye first).
    readLinkLocked(peer);
    if (l.fd) linkClosedLocked(peer, std::string("its liveness connection failed (") +
                                              strerror(errno) + ")");
    return;
  }
}

void PeerMonitor::checkDeadlinesLocked(Clock::time_point now) {
  for (size_t i = pending_.size(); i-- > 0;) {
    if (now > pending_[i].giveUp) {
      ++refused_;  // before the close
      pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  const bool beat = now >= nextBeat_;
  if (beat) nextBeat_ = now + beatEvery_;
  for (int p = 0; p < opts_.size; ++p) {
    Link& l = links_[p];
    if (!l.watched || l.departed || l.reported) continue;
    if (l.fd && beat) {
      queueLocked(p, kBeat);
      flushLocked(p);
    }
    const auto quiet = std::chrono::duration_cast<std::chrono::milliseconds>(now - l.lastHeard);
    const bool retrying = l.retries > 0 && !l.greeted && !l.fd;
    if (retrying && now >= l.reconnectAt && quiet <= opts_.silence) reconnectLocked(p);
    if (l.fd || (!l.greeted && p > opts_.rank) || retrying) {
      if (quiet <= opts_.silence) continue;
      const std::string host = hostDisplayName(opts_.hosts[p]);
      std::string cause;
      if (l.greeted || (l.fd && !retrying)) {
        cause = "host " + host + " silent for " + secondsText(quiet) +
                ": no heartbeat on its liveness connection (SMDDP_PEER_TIMEOUT " +
                secondsText(opts_.silence) + "; link down, host down or stopped)";
      } else if (l.retries > 0) {
        cause = "its liveness listener turned this rank's connection away " +
                std::to_string(l.retries) + " time(s) (busy: flooded?) and no later one got "
                "through within " + secondsText(quiet);
      } else {
        cause = "it opened no liveness connection within " + secondsText(quiet);
      }
      fail(p, "was lost", cause);
    }
  }
}

}  // namespace smddp
