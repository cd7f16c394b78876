// Host topology and liveness (peer_table.h): the "peer" exchange that
// says who and where every rank is, and the liveness checks every wait
// of the engine makes.
#include "engine/peer_table.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "common/error.h"
#include "common/param.h"
#include "common/process.h"

namespace smddp {

SMDDP_PARAM_STRING(paramHostId, "SMDDP_HOST_ID", "",
                   "host identity this rank reports (default: the hostname; the boot_id is "
                   "added); splits one machine into pretend hosts")

namespace {

std::string firstLine(const char* path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

// A host is its host id (SMDDP_HOST_ID, else the hostname) and its boot:
// two machines that share a hostname ("localhost" in some clusters) are
// never taken for one, while containers on one machine with --ipc=host
// (same kernel, same boot_id, same /dev/shm) are.
std::string hostIdentity() {
  std::string id = paramHostId();
  if (id.empty()) {
    char buf[256] = {0};
    gethostname(buf, sizeof(buf) - 1);
    id = buf;
  }
  std::string boot = firstLine("/proc/sys/kernel/random/boot_id");
  return boot.empty() ? id : id + "/" + boot;
}

// "pid:[4026531836]": pids compare only within one PID namespace.
std::string pidNamespace() {
  char buf[64];
  ssize_t n = readlink("/proc/self/ns/pid", buf, sizeof(buf));
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

std::string hexOf(const std::string& bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}

// A peer's public key as it published it; anything but hex digits gives
// a key of the wrong size, which the key derivation refuses naming it.
std::string bytesOfHex(const std::string& hex) {
  auto digit = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    const int hi = digit(hex[i]), lo = digit(hex[i + 1]);
    if (hi < 0 || lo < 0) return "";
    out.push_back(static_cast<char>(hi * 16 + lo));
  }
  return out;
}

}  // namespace

void PeerTable::gather(Bootstrap& bootstrap, int rank, int size,
                       std::chrono::milliseconds timeout, const std::string& publicKey,
                       const std::string& keyCheck, bool wireEncrypt) {
  rank_ = rank;
  size_ = size;
  // Before anything is named after it: peers watch this owner's lock.
  owner_ = ShmOwner::acquire();
  const std::string myHost = hostIdentity();
  std::string me = myHost + "\n" + std::to_string(getpid()) + "\n" + pidNamespace() + "\n" +
                   (owner_ ? owner_->tag() : "") + "\n" + hexOf(publicKey) + "\n" + keyCheck +
                   "\n" + (wireEncrypt ? "1" : "0");
  auto all = bootstrapAllGather(bootstrap, rank, size, "peer", me, timeout);
  for (const auto& s : all) {
    PeerInfo p;
    std::istringstream fields(s);
    std::string pid;
    std::getline(fields, p.host);
    std::getline(fields, pid);
    std::getline(fields, p.pidNamespace);
    std::getline(fields, p.owner);
    std::string key;
    std::getline(fields, key);
    p.publicKey = bytesOfHex(key);
    std::getline(fields, p.keyCheck);
    std::string encrypt;
    std::getline(fields, encrypt);
    p.wireEncrypt = encrypt == "1";
    p.pid = pid.empty() ? 0 : std::stoll(pid);
    peers_.push_back(p);
  }
  std::vector<std::string> hostNames;
  for (int r = 0; r < size; ++r) {
    auto it = std::find(hostNames.begin(), hostNames.end(), peers_[r].host);
    if (it == hostNames.end()) {
      hostNames.push_back(peers_[r].host);
      ranksByHost_.emplace_back();
      it = hostNames.end() - 1;
    }
    ranksByHost_[it - hostNames.begin()].push_back(r);
  }
  hostCount_ = static_cast<int>(ranksByHost_.size());
}

void PeerTable::placeNetworkServers(int64_t perHost) {
  // As on the shared-memory path: the servers spread over each host's ranks.
  netServers_.clear();
  for (const auto& ranks : ranksByHost_) {
    const int local = static_cast<int>(ranks.size());
    const int k = perHost > 0 ? std::min<int>(local, static_cast<int>(perHost)) : local;
    for (int s = 0; s < k; ++s) netServers_.push_back(ranks[s * local / k]);
  }
  std::sort(netServers_.begin(), netServers_.end());
}

bool PeerTable::sharesProcess() const {
  // One shm owner per process (transport/shm_owner.h); without one, the
  // pid in its PID namespace.
  std::set<std::string> seen;
  for (const PeerInfo& p : peers_) {
    const std::string who = p.host + "\n" +
                            (p.owner.empty() ? p.pidNamespace + "\n" + std::to_string(p.pid)
                                             : p.owner);
    if (!seen.insert(who).second) return true;
  }
  return false;
}

void PeerTable::watch(Bootstrap& bootstrap, Endpoint& endpoint, std::vector<fi_addr_t> addrs,
                      std::shared_ptr<const PeerKeys> keys,
                      std::chrono::milliseconds timeout) {
  addrs_ = std::move(addrs);
  // Every peer's owner lock exists by now (it was taken before "peer").
  peerLocks_.resize(size_);
  for (int p = 0; p < size_; ++p) {
    if (p != rank_ && sameHost(p) && !peers_[p].owner.empty()) {
      peerLocks_[p] = std::make_unique<OwnerLock>(peers_[p].owner);
    }
  }
  // Peers on other hosts have no owner lock here: a liveness connection to
  // each tells this rank when one dies or its host falls silent.
  if (!oneHost()) {
    PeerMonitorOptions m;
    m.rank = rank_;
    m.size = size_;
    m.keys = std::move(keys);
    for (const auto& p : peers_) m.hosts.push_back(p.host);
    m.address = endpoint.ipAddress();
    m.silence = PeerMonitor::configuredSilence();
    m.setupTimeout = timeout;
    m.firstUnfinished = firstUnfinished_;
    monitor_ = PeerMonitor::open(bootstrap, std::move(m));
  }
}

void PeerTable::checkAlive(const std::string& during,
                           const std::function<bool(int)>& finished) const {
  PeerFailure f;
  if (monitor_ && monitor_->failed(&f)) {
    throwError(ErrorKind::kPeerLost, "smddp: " + f.who + " " + f.what + " during " + during +
                                         ": " + f.cause);
  }
  // A peer's owner lock is released by the kernel when it dies, whatever
  // PID namespace it runs in; a busy or stopped peer keeps it. /proc is
  // consulted only for a peer in this PID namespace whose lock could not
  // be opened (another /dev/shm).
  const PeerInfo& self = peers_[rank_];
  for (int p = 0; p < size_; ++p) {
    if (p == rank_ || peers_[p].host != self.host || (finished && finished(p))) continue;
    const bool sameNs = peers_[p].pidNamespace == self.pidNamespace;
    const OwnerLock* lock = peerLocks_.size() > static_cast<size_t>(p) ? peerLocks_[p].get()
                                                                       : nullptr;
    bool gone = false;
    if (lock && lock->valid()) gone = lock->ownerGone();
    else if (sameNs && peers_[p].pid > 0) gone = processExited(peers_[p].pid);
    if (gone) {
      throwError(ErrorKind::kPeerLost,
                 "smddp: rank " + std::to_string(p) + " (pid " + std::to_string(peers_[p].pid) +
                     (sameNs ? "" : " in another PID namespace") + ") exited during " + during);
    }
  }
}

bool PeerTable::lost(int p) const {
  if (monitor_ && monitor_->lost(p)) return true;
  const OwnerLock* lock = peerLocks_.size() > static_cast<size_t>(p) ? peerLocks_[p].get()
                                                                     : nullptr;
  return lock && lock->valid() && lock->ownerGone();
}

}  // namespace smddp
