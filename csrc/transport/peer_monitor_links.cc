// How a connection becomes a peer's liveness link (peer_monitor.h): the
// listener's side (accept, read the hello, turn a flood away) and the
// connecting side's (a link closed before any hello is connected again
// when the listener said it was busy, and is a death otherwise). Called by
// the monitor's thread with ioMu_ held.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "transport/liveness_message.h"
#include "transport/peer_monitor.h"
#include "transport/socket_address.h"

namespace smddp {

using namespace liveness;

void PeerMonitor::acceptLocked() {
  while (true) {
    int fd = accept4(listenFd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      // Out of descriptors: the connection stays queued and poll would
      // report it again at once. Leave the listener alone for a while.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        listenPauseUntil_ = Clock::now() + std::chrono::milliseconds(100);
      }
      return;  // EAGAIN, or a connection that went away first
    }
    if (pending_.size() >= kMaxPending) {
      // Full of connections that owe their hello: the oldest goes, never a
      // peer's established link, and it hears it may come again.
      turnAwayLocked(0);
    }
    setNoDelay(fd);
    Pending p;
    p.fd = UniqueFd(fd);
    // A peer says hello as soon as it connects; anything slower is refused.
    p.giveUp = Clock::now() + std::min<Clock::duration>(opts_.silence, std::chrono::seconds(5));
    pending_.push_back(std::move(p));
    // Its hello is usually in already (a peer sends it right after
    // connecting): judged now, a real peer's connection never waits in the
    // queue a flood fills.
    readPendingLocked(pending_.size() - 1);
  }
}

void PeerMonitor::turnAwayLocked(size_t i) {
  const Message busy{kMagic, kVersion, kBusy, 0, static_cast<uint32_t>(opts_.rank), kAnyone, 0,
                     kNoCall, {}};
  const int fd = pending_[i].fd.get();
  (void)send(fd, &busy, sizeof(busy), MSG_DONTWAIT | MSG_NOSIGNAL);
  // Read what it sent first (a peer's hello, at most a few bytes): closing
  // over unread bytes resets the connection, and the reset may overtake
  // the busy message.
  uint8_t sink[256];
  for (int k = 0; k < 16 && recv(fd, sink, sizeof(sink), MSG_DONTWAIT) > 0; ++k) {
  }
  ++refused_;  // counted before the close a test (or a peer) may see first
  pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));  // closes it
}

bool PeerMonitor::readPendingLocked(size_t i) {
  Pending& p = pending_[i];
  ssize_t n = recv(p.fd.get(), p.rx + p.have, kMessageBytes - p.have, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
  bool keep = false;
  int from = -1;
  uint64_t counter = 0;
  if (n > 0) {
    p.have += static_cast<size_t>(n);
    if (p.have < kMessageBytes) return true;
    Message m;
    std::memcpy(&m, p.rx, sizeof(m));
    from = static_cast<int>(m.from);
    counter = m.counter;
    // Only a rank of this group, on another host, above this one (it
    // connects here), not yet connected, with its and this rank's MAC on
    // a hello never heard before.
    keep = m.magic == kMagic && m.version == kVersion && m.type == kHello &&
           m.to == static_cast<uint32_t>(opts_.rank) &&
           m.from < static_cast<uint32_t>(opts_.size) && from > opts_.rank &&
           links_[from].watched && !links_[from].fd && !links_[from].greeted &&
           m.counter > links_[from].heard && authentic(*opts_.keys, m);
  }
  if (!keep) ++refused_;  // counted before its fd closes
  UniqueFd fd = std::move(p.fd);
  pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
  if (!keep) return false;  // fd closes
  Link& l = links_[from];
  l.fd = std::move(fd);
  l.greeted = true;
  l.heard = counter;
  l.lastHeard = Clock::now();
  queueLocked(from, kHello);
  flushLocked(from);
  if (l.fd) readLinkLocked(from);  // a beat may already follow the hello
  return true;
}

void PeerMonitor::readLinkLocked(int peer) {
  Link& l = links_[peer];
  while (l.fd) {
    ssize_t n = recv(l.fd.get(), l.rx + l.have, kMessageBytes - l.have, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      linkClosedLocked(peer, n == 0 ? "its liveness connection closed"
                                    : std::string("its liveness connection failed (") +
                                          strerror(errno) + ")");
      return;
    }
    l.have += static_cast<size_t>(n);
    if (l.have < kMessageBytes) continue;
    l.have = 0;
    Message m;
    std::memcpy(&m, l.rx, sizeof(m));
    if (!l.greeted && m.magic == kMagic && m.version == kVersion && m.type == kBusy &&
        m.from == static_cast<uint32_t>(peer)) {
      l.turnedAway = true;  // its listener was full: connect again (linkClosedLocked)
      continue;
    }
    const bool valid = m.magic == kMagic && m.version == kVersion &&
                       m.from == static_cast<uint32_t>(peer) &&
                       m.to == static_cast<uint32_t>(opts_.rank) &&
                       (l.greeted ? m.type == kBeat || m.type == kBye : m.type == kHello) &&
                       m.counter > l.heard && authentic(*opts_.keys, m);
    if (!valid) {
      // Nobody without the pair's key can write an authentic message: this
      // is not the peer we connected to (its port reused after it died), a
      // forger or replayer in the path, or a bug.
      l.fd.reset();
      fail(peer, "was lost", "its liveness connection sent a message that is not the group's");
      return;
    }
    l.lastHeard = Clock::now();
    l.heard = m.counter;
    if (m.type == kHello) l.greeted = true;
    if (m.type == kBye) {
      l.departed = true;
      l.leftBefore = m.leftBefore;
      l.leftAt = l.lastHeard;
      anyLeft_ = true;
    }
  }
}

void PeerMonitor::linkClosedLocked(int peer, const std::string& how) {
  Link& l = links_[peer];
  l.fd.reset();
  if (l.departed) return;  // it left the group in order
  if (l.turnedAway && !l.greeted) {
    // Its listener turned this connection away unheard (a flood filled
    // it): not a death. Connect again soon; its silence still counts from
    // the last time it was heard.
    l.turnedAway = false;
    l.reconnectAt = Clock::now() + std::chrono::milliseconds(100);
    ++l.retries;
    return;
  }
  // The kernel closes a dead process's sockets, and nothing else closes
  // this one without the goodbye first.
  fail(peer, "died", how + " without a goodbye: its process exited or was killed");
}

void PeerMonitor::reconnectLocked(int peer) {
  Link& l = links_[peer];
  // Briefly: this is the monitor thread, which beats for every other peer.
  std::string why;
  const int fd = connectBefore(opts_.address, addresses_[peer], ports_[peer],
                               Clock::now() + std::chrono::milliseconds(200), &why);
  if (fd < 0) {
    l.reconnectAt = Clock::now() + std::chrono::milliseconds(200);
    return;
  }
  l.fd = UniqueFd(fd);
  l.have = 0;
  l.tx.clear();
  queueLocked(peer, kHello);
  flushLocked(peer);
}

}  // namespace smddp
