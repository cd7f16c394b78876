// Liveness of the ranks on other hosts (docs/design.md, "Failure model").
// Peers on this host are watched through their owner locks (shm_owner.h);
// a peer on another host has none, and libfabric's tcp;ofi_rxm reports
// nothing when it dies. So each rank keeps one small TCP connection to
// every rank on another host, and a background thread polls them: a
// connection the kernel closed without a goodbye is a dead process (seen at
// once), a connection with no heartbeat for SMDDP_PEER_TIMEOUT is a host
// gone silent. The engine asks failed() from every wait (PeerTable::checkAlive).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/unique_fd.h"
#include "transport/bootstrap.h"
#include "transport/peer_keys.h"

namespace smddp {

struct PeerMonitorOptions {
  int rank = 0;
  int size = 1;
  // The group's pair keys: every message carries the MAC of its sender and
  // receiver's key (a hello without it is refused, a link that sends one
  // without it is lost). Required when the group spans hosts.
  std::shared_ptr<const PeerKeys> keys;
  std::vector<std::string> hosts;  // every rank's host identity (host id "/" boot id)
  std::string address;             // numeric IP this rank listens on and connects from
  std::chrono::milliseconds silence{10000};          // SMDDP_PEER_TIMEOUT
  std::chrono::milliseconds setupTimeout{300000};    // bounds the connect phase
  // Set by open(): a fifth of the shortest silence of any rank (at most
  // 1 s), so one late beat is never a loss.
  std::chrono::milliseconds beatEvery{1000};
  // The first call of the group this rank has not finished, kept current
  // by its engine (null or UINT64_MAX: unknown). Its goodbye carries it, so
  // that a peer waiting in that call, which will never complete, fails at
  // once instead of waiting out the group timeout.
  std::shared_ptr<const std::atomic<uint64_t>> firstUnfinished;
};

// A peer on another host that died or went silent.
struct PeerFailure {
  int rank = -1;
  std::string who;    // "rank 3 on host h1 (10.77.0.11)"
  std::string what;   // "died" or "was lost"
  std::string cause;  // why this rank believes it
};

class PeerMonitor {
 public:
  // SMDDP_PEER_TIMEOUT: silence after which a peer's host counts as lost;
  // zero turns the liveness connections off on this rank.
  static std::chrono::milliseconds configuredSilence();

  // Collective over `bootstrap` among all ranks of a group that spans
  // hosts: publishes this rank's listening address, connects to the ranks
  // on other hosts below it (the ones above connect here) and starts the
  // monitor thread. Null when opts.silence is zero (the rank still takes
  // part in the exchange, so its peers simply do not watch it). Throws
  // kTransport when a peer cannot be reached within opts.setupTimeout.
  static std::unique_ptr<PeerMonitor> open(Bootstrap& bootstrap, PeerMonitorOptions opts);

  // Says goodbye to every peer (so they do not take this rank for dead),
  // stops the thread and closes the sockets, within about 100 ms.
  ~PeerMonitor();
  PeerMonitor(const PeerMonitor&) = delete;
  PeerMonitor& operator=(const PeerMonitor&) = delete;

  // The first peer this rank saw die or fall silent. Any thread; cheap.
  bool failed(PeerFailure* out) const;
  // Whether `rank` died or fell silent (any thread): nothing sent to it can
  // arrive, so there is no point waiting for its endpoint to take it.
  bool lost(int rank) const;
  // A peer that said goodbye before running call `seq` of the group (see
  // PeerMonitorOptions::firstUnfinished): its rank, and when it left. Any
  // thread; one atomic load while nobody has left.
  bool leftBefore(uint64_t seq, int* rank, std::chrono::steady_clock::time_point* when) const;
  // When `rank` said goodbye, if it did (any thread).
  bool leftAt(int rank, std::chrono::steady_clock::time_point* when) const;
  // Connections offered to the listener that did not open with a valid hello.
  uint64_t refusedConnections() const { return refused_.load(); }
  int listenPort() const { return listenPort_; }
  // Ranks this monitor watches (on other hosts, with liveness on).
  std::vector<int> watchedRanks() const;

  // Sends the goodbye now, from any thread (process exit; see peer_monitor.cc).
  void sayGoodbye();
  // Test hook: close every socket without a goodbye, as the kernel does
  // for a process that dies, and stop watching.
  void dropWithoutGoodbye();

  // Test hook: stop the thread but keep the sockets open, as a stopped
  // process or a cut link would: peers see silence, not a close.
  void freezeForTest();

  PeerMonitor(PeerMonitorOptions opts, int listenFd, std::vector<std::string> addresses,
              std::vector<int> ports);
  // Closes this process's copies of the sockets in a forked child (whose
  // parent keeps watching with the originals).
  void closeInForkedChild();

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr size_t kMessageBytes = 48;
  // The connection to one rank on another host.
  struct Link {
    UniqueFd fd;
    bool watched = false;   // on another host, with liveness on
    bool greeted = false;   // its hello arrived
    bool departed = false;  // it said goodbye: its close is no death
    uint64_t leftBefore = UINT64_MAX;  // its goodbye's first call it never ran
    Clock::time_point leftAt{};        // when its goodbye came
    bool reported = false;  // a failure was recorded for it
    // Its listener turned this rank's connection away before any hello
    // (kBusy): a retry, not a death. Only on links this rank connects.
    bool turnedAway = false;
    int retries = 0;
    Clock::time_point reconnectAt{};
    Clock::time_point lastHeard{};
    uint64_t sent = 0;   // counter of the last message queued to it
    uint64_t heard = 0;  // counter of the last authentic one from it
    uint8_t rx[kMessageBytes] = {};
    size_t have = 0;
    std::string tx;  // bytes not yet written
  };
  // An accepted connection whose hello has not arrived yet.
  struct Pending {
    UniqueFd fd;
    uint8_t rx[kMessageBytes] = {};
    size_t have = 0;
    Clock::time_point giveUp{};
  };
  struct PollSlot {
    int kind;   // 0 wake, 1 listener, 2 pending, 3 link
    int index;  // pending index or rank
  };

  void connectToLowerPeers();
  void run();
  // One turn of the thread: I/O on every socket, heartbeats, deadlines.
  // Called with ioMu_ held.
  void acceptLocked();
  // Reads pending_[i]'s hello; false when the connection was dropped.
  bool readPendingLocked(size_t i);
  // Closes pending_[i] after telling it the listener is busy (kBusy).
  void turnAwayLocked(size_t i);
  // Connects again to a lower peer whose listener turned this rank away.
  void reconnectLocked(int peer);
  void readLinkLocked(int peer);
  void flushLocked(int peer);
  void queueLocked(int peer, uint8_t type);
  // The link's connection ended: a death unless the peer said goodbye.
  void linkClosedLocked(int peer, const std::string& how);
  void checkDeadlinesLocked(Clock::time_point now);
  void fail(int peer, const char* what, const std::string& cause);
  std::string describe(int peer) const;
  void stopThread();
  // Closes every link, pending connection and the listener. Callers hold
  // ioMu_, except a forked child (closeInForkedChild). `drainFirst` reads
  // unread bytes first so that the close sends a FIN, not a reset.
  void closeSockets(bool drainFirst);

  PeerMonitorOptions opts_;
  std::vector<std::string> addresses_;  // every rank's published IP ("" if it is not watched)
  std::chrono::milliseconds beatEvery_;
  std::vector<int> ports_;              // every rank's listening port
  UniqueFd listenFd_;
  int listenPort_ = 0;
  Clock::time_point started_{}, nextBeat_{};  // monitor thread only
  UniqueFd wakeFd_;  // eventfd: ends the thread's poll at once
  long creatorPid_ = 0;

  mutable std::mutex ioMu_;  // every socket and everything below
  std::vector<Link> links_;        // by rank; guarded by ioMu_
  std::vector<Pending> pending_;   // accepted, hello not yet read; guarded by ioMu_
  bool goodbyeSaid_ = false;       // guarded by ioMu_
  bool frozen_ = false;            // guarded by ioMu_ (freezeForTest)
  Clock::time_point listenPauseUntil_{};  // out of fds: the listener waits; guarded by ioMu_

  mutable std::mutex failMu_;
  PeerFailure failure_;            // guarded by failMu_
  std::vector<char> lost_;         // by rank; guarded by failMu_
  std::atomic<bool> failed_{false};
  std::atomic<uint64_t> refused_{0};
  std::atomic<bool> anyLeft_{false};  // some peer said goodbye (leftBefore's fast path)
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// "h1" for a host identity "h1/<boot id>": the part people named.
std::string hostDisplayName(const std::string& identity);

}  // namespace smddp
