// Who owns what smddp puts in /dev/shm, and whether that owner still lives.
// Every object is named "smddp-o<16 hex>-<what>", the tag of the process
// that made it, and that process holds an flock on "smddp-o<tag>-lock" for as
// long as any of its objects may be in use. The kernel drops the lock when
// the process dies, in whatever PID namespace it ran, so the lock (not a
// pid in /proc, not a heartbeat a busy rank might miss) tells peers on this
// host that a rank is gone, and tells the sweeper which objects are stale.
#pragma once

#include <memory>
#include <string>

namespace smddp {

class ShmOwner {
 public:
  // This process's owner, made on first use and shared by everything that
  // names objects after it; null when /dev/shm cannot hold the lock file.
  static std::shared_ptr<ShmOwner> acquire();
  ~ShmOwner();  // unlocks and removes the lock file (in the process that made it)
  ShmOwner(const ShmOwner&) = delete;
  ShmOwner& operator=(const ShmOwner&) = delete;

  // "o" and 16 hex digits: starts with a letter, so an older smddp's
  // sweeper, which parses a pid after "smddp-", leaves these objects alone.
  const std::string& tag() const { return tag_; }
  // The shm_open name ("/smddp-<tag>-<what>") of one of this owner's objects.
  std::string objectName(const std::string& what) const { return "/smddp-" + tag_ + "-" + what; }

  ShmOwner(int fd, std::string tag);

 private:
  int fd_;  // holds the flock; closed in forked children (see shm_owner.cc)
  long creatorPid_;
  std::string tag_;
};

// The lock of another owner (a peer rank), opened once and polled cheaply.
class OwnerLock {
 public:
  explicit OwnerLock(const std::string& tag);
  ~OwnerLock();
  OwnerLock(const OwnerLock&) = delete;
  OwnerLock& operator=(const OwnerLock&) = delete;
  // False when the lock file could not be opened (another /dev/shm, or
  // the owner was already gone): the caller must use another signal.
  bool valid() const { return fd_ >= 0; }
  // True once nobody holds the owner's lock: the owner process has exited.
  bool ownerGone() const;

 private:
  int fd_ = -1;
};

// Removes every object in /dev/shm whose owner's lock is free or missing:
// the leftovers of jobs that died. Objects of a live owner, and names not
// made by this scheme, are never touched.
void sweepDeadShmObjects();

}  // namespace smddp
