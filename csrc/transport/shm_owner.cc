#include "transport/shm_owner.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <map>
#include <mutex>
#include <random>
#include <vector>

namespace smddp {

namespace {

constexpr const char* kDir = "/dev/shm/";
constexpr size_t kTagChars = 17;  // "o" + 16 hex

std::string lockPath(const std::string& tag) { return kDir + ("smddp-" + tag) + "-lock"; }

// The process's owner, and the fd a fork handler must close in the child:
// a forked child (a DataLoader worker, say) shares the parent's open file
// description, and with it the flock, so the parent's death would go
// unseen for as long as the child lived.
std::mutex gMu;
std::weak_ptr<ShmOwner> gOwner;  // guarded by gMu
int gLockFd = -1;                // guarded by gMu

void forkPrepare() { gMu.lock(); }
void forkParent() { gMu.unlock(); }
void forkChild() {
  if (gLockFd >= 0) close(gLockFd);  // closes the child's copy; the parent keeps its lock
  gLockFd = -1;
  gOwner.reset();
  gMu.unlock();
}

std::string randomTag() {
  std::random_device rd;
  unsigned long long v = (static_cast<unsigned long long>(rd()) << 32) ^ rd();
  char buf[kTagChars + 1];
  std::snprintf(buf, sizeof(buf), "o%016llx", v);
  return buf;
}

bool isHex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

// The owner tag of an object name "smddp-o<16 hex>-...", or "".
std::string tagOf(const std::string& name) {
  const size_t p = 6;  // strlen("smddp-")
  if (name.rfind("smddp-o", 0) != 0 || name.size() < p + kTagChars + 1 ||
      name[p + kTagChars] != '-') {
    return "";
  }
  for (size_t i = p + 1; i < p + kTagChars; ++i) {
    if (!isHex(name[i])) return "";
  }
  return name.substr(p, kTagChars);
}

// A lock file, locked before it gets its final name: a sweeper may remove
// the temporary name (it is unlocked until flock returns), never the final.
std::shared_ptr<ShmOwner> createOwner() {
  for (int attempt = 0; attempt < 8; ++attempt) {
    const std::string tag = randomTag();
    const std::string final = lockPath(tag);
    const std::string tmp = final + ".tmp";
    // 0600: only this user's processes (the job's ranks) open it to watch it.
    int fd = open(tmp.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
      if (errno == EEXIST) continue;
      return nullptr;  // no writable /dev/shm
    }
    if (flock(fd, LOCK_EX | LOCK_NB) == 0 && rename(tmp.c_str(), final.c_str()) == 0) {
      return std::make_shared<ShmOwner>(fd, tag);
    }
    unlink(tmp.c_str());  // fails harmlessly when a sweeper already did it
    close(fd);
  }
  return nullptr;
}

}  // namespace

ShmOwner::ShmOwner(int fd, std::string tag)
    : fd_(fd), creatorPid_(static_cast<long>(getpid())), tag_(std::move(tag)) {}

ShmOwner::~ShmOwner() {
  std::lock_guard<std::mutex> lock(gMu);
  if (creatorPid_ != static_cast<long>(getpid())) return;  // a forked child's copy
  // Name first, then the lock: a peer holding the file open sees it free.
  unlink(lockPath(tag_).c_str());
  close(fd_);
  if (gLockFd == fd_) gLockFd = -1;
}

std::shared_ptr<ShmOwner> ShmOwner::acquire() {
  static const int registered = pthread_atfork(forkPrepare, forkParent, forkChild);
  (void)registered;
  std::lock_guard<std::mutex> lock(gMu);
  if (auto existing = gOwner.lock()) return existing;
  auto owner = createOwner();
  if (owner) {
    gOwner = owner;
    gLockFd = owner->fd_;
  }
  return owner;
}

OwnerLock::OwnerLock(const std::string& tag) {
  if (!tag.empty()) fd_ = open(lockPath(tag).c_str(), O_RDONLY | O_CLOEXEC);
}

OwnerLock::~OwnerLock() {
  if (fd_ >= 0) close(fd_);
}

bool OwnerLock::ownerGone() const {
  if (fd_ < 0) return false;
  // A shared lock is granted only once the owner's exclusive one is gone.
  if (flock(fd_, LOCK_SH | LOCK_NB) != 0) return false;
  flock(fd_, LOCK_UN);
  return true;
}

void sweepDeadShmObjects() {
  std::map<std::string, std::vector<std::string>> byTag;
  DIR* d = opendir(kDir);
  if (!d) return;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    std::string tag = tagOf(name);
    if (!tag.empty()) byTag[tag].push_back(name);
  }
  closedir(d);
  for (const auto& [tag, names] : byTag) {
    int fd = open(lockPath(tag).c_str(), O_RDONLY | O_CLOEXEC);
    // No lock file: its owner ended (it removes the lock last) or never
    // finished creating it. A lock we cannot open (another user's) or that
    // someone holds: leave everything of that owner alone.
    bool dead = fd < 0 ? errno == ENOENT : flock(fd, LOCK_SH | LOCK_NB) == 0;
    if (dead) {
      for (const auto& n : names) {
        if (kDir + n != lockPath(tag)) unlink((kDir + n).c_str());
      }
      if (fd >= 0) unlink(lockPath(tag).c_str());
    }
    if (fd >= 0) close(fd);
  }
}

}  // namespace smddp
