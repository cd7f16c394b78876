// Host topology and liveness of one group: who every rank is (host, pid,
// shm owner, fabric address), how the ranks group into hosts, which of them
// serve the network path's shards, and whether a peer is still alive. The
// engine context builds it while it sets the group up; every wait of the
// engine asks it about lost peers (checkAlive).
#pragma once

#include <rdma/fabric.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "transport/bootstrap.h"
#include "transport/endpoint.h"
#include "transport/peer_monitor.h"
#include "transport/shm_owner.h"

namespace smddp {

struct PeerInfo {
  std::string host;          // host id and boot_id (peer_table.cc, hostIdentity)
  int64_t pid = 0;           // in the peer's own PID namespace
  std::string pidNamespace;  // pids compare only when these match
  std::string owner;         // its shm owner tag: a lock that says it lives
  std::string publicKey;     // its X25519 public key for this group (raw bytes)
  std::string keyCheck;      // a one-way check of its key file, "" without one
  bool wireEncrypt = false;  // its SMDDP_WIRE_ENCRYPT: every rank must agree
};

// Set up by the engine context's constructor in two steps (gather, then
// watch once the endpoint exists) and released by its shutdown; read by
// the worker thread (or a caller running its own call) in between. The
// monitor's own methods may be called from any thread.
class PeerTable {
 public:
  PeerTable() = default;
  PeerTable(const PeerTable&) = delete;
  PeerTable& operator=(const PeerTable&) = delete;

  // Takes this rank's owner lock (before anything is named after it:
  // peers watch it), then exchanges every rank's host identity, pid, PID
  // namespace, owner tag, `publicKey` (its X25519 key for the group's
  // pair keys), `keyCheck` and `wireEncrypt` (key "peer") and groups the
  // ranks by host.
  void gather(Bootstrap& bootstrap, int rank, int size, std::chrono::milliseconds timeout,
              const std::string& publicKey, const std::string& keyCheck, bool wireEncrypt);
  // Once the endpoint exists: the peers' fabric addresses, the owner locks
  // of the peers on this host and, when the group spans hosts, the
  // liveness connections to the others (collective over `bootstrap`).
  void watch(Bootstrap& bootstrap, Endpoint& endpoint, std::vector<fi_addr_t> addrs,
             std::shared_ptr<const PeerKeys> keys, std::chrono::milliseconds timeout);
  // Shutdown, first step: closes the liveness connections with a goodbye,
  // so peers on other hosts do not take this rank for dead.
  void closeMonitor() { monitor_.reset(); }
  // Shutdown, last step: closes the same-host peers' owner locks.
  void releaseLocks() { peerLocks_.clear(); }

  int rank() const { return rank_; }
  int size() const { return size_; }
  const PeerInfo& info(int r) const { return peers_[r]; }
  const std::vector<PeerInfo>& all() const { return peers_; }
  fi_addr_t addr(int r) const { return addrs_[r]; }
  bool oneHost() const { return hostCount_ == 1; }
  // Two ranks of the group are threads of one process (one shm owner).
  bool sharesProcess() const;
  bool sameHost(int r) const { return peers_[r].host == peers_[rank_].host; }
  int hostCount() const { return hostCount_; }
  // Ranks by host, hosts in order of their lowest rank, ranks ascending.
  const std::vector<std::vector<int>>& ranksByHost() const { return ranksByHost_; }
  // Once gathered (the engine context's constructor): the ranks that run
  // the network path's reduction servers, every rank or `perHost` ranks per
  // host (SMDDP_SERVERS_PER_NODE; 0: every rank) spread over its ranks.
  void placeNetworkServers(int64_t perHost);
  // Those ranks, ascending: server index i is rank networkServers()[i].
  const std::vector<int>& networkServers() const { return netServers_; }

  // Throws PeerLost if a same-host peer process has exited (its shm owner
  // lock is free; see transport/shm_owner.h), or a peer on another host
  // died or went silent (transport/peer_monitor.h).
  // `finished(p)`: peer p is known to have run every call this wait is
  // for, and left after (its leave notice): its exit is no failure here.
  void checkAlive(const std::string& during,
                  const std::function<bool(int)>& finished = nullptr) const;
  // Whether peer `p` is known to be gone: its owner lock is free (same
  // host) or the liveness monitor lost it (another host).
  bool lost(int p) const;
  // The liveness connections to ranks on other hosts; null on one host or
  // with SMDDP_PEER_TIMEOUT=0.
  const PeerMonitor* monitor() const { return monitor_.get(); }
  // The engine's first unfinished call (Communicator, as calls come and
  // go): this rank's liveness goodbye tells the peers on other hosts,
  // should the process exit without shutting the group down.
  void noteFirstUnfinished(uint64_t seq) const { firstUnfinished_->store(seq); }

 private:
  int rank_ = 0;
  int size_ = 1;
  std::vector<PeerInfo> peers_;
  std::vector<std::vector<int>> ranksByHost_;
  int hostCount_ = 0;
  std::vector<int> netServers_;
  std::vector<fi_addr_t> addrs_;
  std::shared_ptr<ShmOwner> owner_;                   // this rank's liveness lock
  std::vector<std::unique_ptr<OwnerLock>> peerLocks_;  // same-host peers' locks, by rank
  std::unique_ptr<PeerMonitor> monitor_;               // peers on other hosts
  // Shared with the monitor, whose goodbye (the exit handler's too) reads it.
  std::shared_ptr<std::atomic<uint64_t>> firstUnfinished_ =
      std::make_shared<std::atomic<uint64_t>>(UINT64_MAX);
};

}  // namespace smddp
