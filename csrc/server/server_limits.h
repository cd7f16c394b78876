// What a standalone reduction server (standalone_server.h) lets its
// clients hold, and the bookkeeping that keeps them to it: open
// connections, unproven ones per source address, a job's proved
// connections, and the memory its streams' pieces may take (docs/servers.md,
// "Limits a server keeps"). The accept loops ask it before they admit a
// connection or a host; what it grants goes back when its holder lets go.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

namespace smddp {

struct ServerFrame;

// SMDDP_SERVER_MAX_WAIT: the longest wait a hello may announce.
std::chrono::seconds serverMaxWaitParam();

// A reservation of `bytes` from a server's pool that goes back unless a
// stream takes it over (release()).
struct HeldBytes {
  HeldBytes(std::atomic<int64_t>& p, int64_t b) : pool(p), bytes(b) {}
  HeldBytes(HeldBytes&& o) noexcept : pool(o.pool), bytes(std::exchange(o.bytes, 0)) {}
  ~HeldBytes() { pool.fetch_sub(bytes); }
  int64_t release() { return std::exchange(bytes, 0); }
  std::atomic<int64_t>& pool;
  int64_t bytes;
};

// Proved connections per job id, across a server's ports (any thread).
class JobQuota {
 public:
  explicit JobQuota(int64_t limit) : limit_(limit) {}
  int64_t limit() const { return limit_; }
  bool take(const std::string& job);
  void give(const std::string& job);

 private:
  std::mutex mu_;  // guards held_
  std::map<std::string, int64_t> held_;
  const int64_t limit_;
};

// One connection of a job's quota, given back when its holder lets go.
class JobSlot {
 public:
  JobSlot(JobQuota* quota, std::string job) : quota_(quota), job_(std::move(job)) {}
  JobSlot(JobSlot&& o) noexcept
      : quota_(std::exchange(o.quota_, nullptr)), job_(std::move(o.job_)) {}
  JobSlot& operator=(JobSlot&&) = delete;
  ~JobSlot() {
    if (quota_) quota_->give(job_);
  }

 private:
  JobQuota* quota_;
  std::string job_;
};

// What a host's hello was granted: its memory reservation and its job's
// connection, both given back unless its stream takes them over.
struct HostGrant {
  HeldBytes bytes;
  JobSlot slot;
};

class ServerLimits {
 public:
  // Each 0 takes its variable: SMDDP_SERVER_MAX_CONNECTIONS,
  // SMDDP_SERVER_UNPROVEN_PER_SOURCE, SMDDP_SERVER_JOB_CONNECTIONS,
  // SMDDP_SERVER_MEMORY_BUDGET (0 there too: half the machine's memory).
  ServerLimits(int64_t maxConnections, int64_t unprovenPerSource, int64_t jobConnections,
               int64_t memoryBudget);

  int64_t maxConnections() const { return maxConnections_; }
  int64_t memoryBudget() const { return memoryBudget_; }
  // Bytes reserved now, all streams (a waiting stream holds its hosts' share
  // until its last owner lets go).
  std::atomic<int64_t>& reserved() { return reserved_; }
  int64_t reservedNow() const { return reserved_.load(); }

  // Whether a new connection from `source` may wait for its proof, given
  // the unproven connections each source holds on its port and the
  // connections open across the ports: kFits; kEvict, the oldest unproven
  // connection of `*evict` making room (the source's own past its share,
  // else, when full, that of the source holding the most); or kFull, none
  // to drop (the new one is turned away).
  enum class Room { kFits, kEvict, kFull };
  Room roomFor(const std::map<std::string, int64_t>& unprovenBySource, const std::string& source,
               int64_t open, std::string* evict) const;
  // "(SMDDP_SERVER_MAX_CONNECTIONS=N, SMDDP_SERVER_UNPROVEN_PER_SOURCE=M)".
  std::string roomSettings() const;
  // What a proved hello may make the server hold (hosts, its job's
  // connections, reserved memory): "" and `out` set, or why not.
  std::string grant(const ServerFrame& hello, const std::string& job,
                    std::unique_ptr<HostGrant>* out);

 private:
  int64_t maxConnections_, unprovenPerSource_, memoryBudget_;
  JobQuota jobQuota_;
  std::atomic<int64_t> reserved_{0};
};

}  // namespace smddp
