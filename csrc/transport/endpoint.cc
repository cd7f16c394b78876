#include "transport/endpoint.h"

#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>

#include "common/error.h"
#include "transport/shm_owner.h"
#include "transport/socket_address.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

namespace smddp {

namespace {

FidPtr<fid_av> openAv(fid_domain* domain, size_t count) {
  fi_av_attr attr{};
  attr.type = FI_AV_TABLE;
  attr.count = count;
  fid_av* av = nullptr;
  checkFi(fi_av_open(domain, &attr, &av, nullptr), "fi_av_open");
  return FidPtr<fid_av>(av);
}

FidPtr<fid_cq> openCq(fid_domain* domain) {
  fi_cq_attr attr{};
  attr.format = FI_CQ_FORMAT_TAGGED;
  attr.wait_obj = FI_WAIT_NONE;
  attr.size = 4096;
  fid_cq* cq = nullptr;
  checkFi(fi_cq_open(domain, &attr, &cq, nullptr), "fi_cq_open");
  return FidPtr<fid_cq>(cq);
}

// shm names its shared-memory region after the endpoint, by default
// "<pid>:<n>:<n>". A process that dies without closing leaves that region in
// /dev/shm, and a later process with the same pid then fails in fi_enable
// (EBUSY); pids also repeat across PID namespaces. So the region is named
// after this process's shm owner (transport/shm_owner.h), whose lock tells
// the sweeper, run first, which regions belong to dead processes.
std::string uniqueShmName(const ShmOwner* owner) {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  char buf[64];
  std::snprintf(buf, sizeof(buf), "ep%llu-%08x", static_cast<unsigned long long>(counter++),
                rd());
  // Without an owner (no writable /dev/shm) shm cannot work anyway; the
  // name then only has to be unique.
  return owner ? owner->objectName(buf).substr(1)
               : "smddp-p" + std::to_string(getpid()) + "-" + buf;
}

// libfabric's shm provider sizes its region with ftruncate alone, so a
// /dev/shm that fills up later (our host segment, another job) SIGBUSes it
// mid-transfer. Reserving the pages now turns that into an error at set-up,
// while the caller can still choose another provider.
void reserveShmRegion(const std::string& name) {
  int fd = open(("/dev/shm/" + name).c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return;  // not where we expect it: nothing we can reserve
  struct stat st{};
  int rc = fstat(fd, &st) == 0 ? posix_fallocate(fd, 0, st.st_size) : errno;
  close(fd);
  if (rc != 0) {
    char size[32];
    std::snprintf(size, sizeof(size), "%.1f MiB", static_cast<double>(st.st_size) / 1048576.0);
    throwError(ErrorKind::kTransport, std::string("no room in /dev/shm for libfabric's ") + size +
                                          " shm region (" + std::strerror(rc) + ")");
  }
}

FidPtr<fid_ep> openEndpoint(fid_domain* domain, fi_info* info, fid_av* av, fid_cq* cq,
                            bool shm, const ShmOwner* shmOwner) {
  fid_ep* ep = nullptr;
  checkFi(fi_endpoint(domain, info, &ep, nullptr), "fi_endpoint");
  FidPtr<fid_ep> owned(ep);
  std::string name;
  if (shm) {
    sweepDeadShmObjects();
    name = uniqueShmName(shmOwner);
    checkFi(fi_setname(&ep->fid, name.data(), name.size() + 1), "fi_setname");
  }
  checkFi(fi_ep_bind(ep, &av->fid, 0), "fi_ep_bind(av)");
  checkFi(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind(cq)");
  checkFi(fi_enable(ep), "fi_enable");
  if (shm) reserveShmRegion(name);
  return owned;
}

}  // namespace

Endpoint::Endpoint(std::shared_ptr<Fabric> fabric) : fabric_(std::move(fabric)) {
  av_ = openAv(fabric_->domain(), 64);
  cq_ = openCq(fabric_->domain());
  if (fabric_->provider() == "shm") shmOwner_ = ShmOwner::acquire();
  ep_ = openEndpoint(fabric_->domain(), fabric_->info(), av_.get(), cq_.get(),
                     fabric_->provider() == "shm", shmOwner_.get());
  maxMsgSize_ = fabric_->info()->ep_attr->max_msg_size;
}

std::string Endpoint::name() const {
  char buf[256];
  size_t len = sizeof(buf);
  checkFi(fi_getname(&ep_->fid, buf, &len), "fi_getname");
  return std::string(buf, len);
}

std::string Endpoint::ipAddress() const {
  const uint32_t format = fabric_->info()->addr_format;
  if (format != FI_SOCKADDR && format != FI_SOCKADDR_IN && format != FI_SOCKADDR_IN6) return "";
  const std::string n = name();
  return numericAddress(n.data(), n.size());
}

std::vector<fi_addr_t> Endpoint::insertPeers(const std::vector<std::string>& names) {
  std::vector<fi_addr_t> addrs(names.size(), FI_ADDR_NOTAVAIL);
  for (size_t i = 0; i < names.size(); ++i) {
    int rc = fi_av_insert(av_.get(), names[i].data(), 1, &addrs[i], 0, nullptr);
    if (rc != 1) {
      throwError(ErrorKind::kTransport,
                 "fi_av_insert failed for the address of rank " + std::to_string(i) +
                     (rc < 0 ? std::string(": ") + fi_strerror(-rc) : std::string()));
    }
  }
  return addrs;
}

bool Endpoint::warmUp(std::chrono::milliseconds timeout) {
  const std::string self = name();
  fi_addr_t addr = FI_ADDR_NOTAVAIL;
  if (fi_av_insert(av_.get(), self.data(), 1, &addr, 0, nullptr) != 1) return false;
  // On the heap, and leaked if the message does not come back: the
  // provider may still write the receive or read the send until the
  // caller has closed the endpoint.
  struct Message {
    uint64_t out = 1, in = 0;
    iovec sendIov{&out, sizeof(out)}, recvIov{&in, sizeof(in)};
    fi_context2 sendCtx{}, recvCtx{};
  };
  auto m = std::make_unique<Message>();
  constexpr uint64_t kTag = 0x5741524d;  // "WARM"; nothing else is posted here
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto posted = [&](auto post) {
    while (post() == -FI_EAGAIN) {
      Completion c;
      (void)poll(&c, 1);  // nothing else is posted, nothing completes
      if (std::chrono::steady_clock::now() > deadline) return false;
    }
    return true;
  };
  int done = 0;
  if (posted([&] { return postRecv(addr, kTag, 0, &m->recvIov, 1, &m->recvCtx); }) &&
      posted([&] { return postSend(addr, kTag, &m->sendIov, 1, &m->sendCtx); })) {
    while (done < 2 && std::chrono::steady_clock::now() <= deadline) {
      Completion c[2];
      const size_t n = poll(c, 2);
      for (size_t i = 0; i < n; ++i) done += c[i].err ? -8 : 1;
      if (done < 0) break;
    }
  }
  if (done != 2 || m->in != m->out) {
    (void)m.release();
    return false;
  }
  // Leave the AV as a fresh endpoint's: the group's peers get the
  // addresses a fresh endpoint would give them (rxm closes the loopback
  // connection; the transmit pool stays).
  return fi_av_remove(av_.get(), &addr, 1, 0) == 0;
}

int Endpoint::postSend(fi_addr_t dest, uint64_t tag, const iovec* iov, size_t iovCount, void* ctx) {
  ssize_t rc = fi_tsendv(ep_.get(), iov, nullptr, iovCount, dest, tag, ctx);
  if (rc == -FI_EAGAIN) return -FI_EAGAIN;
  checkFi(static_cast<int>(rc), "fi_tsendv");
  return 0;
}

int Endpoint::postRecv(fi_addr_t src, uint64_t tag, uint64_t ignore, const iovec* iov,
                       size_t iovCount, void* ctx) {
  ssize_t rc = fi_trecvv(ep_.get(), iov, nullptr, iovCount, src, tag, ignore, ctx);
  // shm reports a full receive queue as -FI_ENOMEM: retryable, like EAGAIN.
  if (rc == -FI_EAGAIN || rc == -FI_ENOMEM) return -FI_EAGAIN;
  checkFi(static_cast<int>(rc), "fi_trecvv");
  return 0;
}

int Endpoint::cancel(void* ctx) {
  ssize_t rc = fi_cancel(&ep_->fid, ctx);
  return rc < 0 ? static_cast<int>(rc) : 0;
}

size_t Endpoint::poll(Completion* out, size_t max) {
  fi_cq_tagged_entry entries[16];
  size_t want = max < 16 ? max : 16;
  ssize_t n = fi_cq_read(cq_.get(), entries, want);
  if (n > 0) {
    for (ssize_t i = 0; i < n; ++i) {
      out[i] = Completion{};
      out[i].context = entries[i].op_context;
      out[i].len = entries[i].len;
      out[i].tag = entries[i].tag;
    }
    return static_cast<size_t>(n);
  }
  if (n == -FI_EAGAIN) return 0;
  if (n == -FI_EAVAIL) {
    fi_cq_err_entry err{};
    ssize_t rc = fi_cq_readerr(cq_.get(), &err, 0);
    if (rc < 0) return 0;
    out[0] = Completion{};
    out[0].context = err.op_context;
    out[0].len = err.len;
    out[0].tag = err.tag;
    out[0].err = err.err ? err.err : FI_EOTHER;
    out[0].olen = err.olen;
    char buf[256];
    const char* text = fi_cq_strerror(cq_.get(), err.prov_errno, err.err_data, buf, sizeof(buf));
    out[0].errText = std::string(fi_strerror(out[0].err)) + (text ? std::string(": ") + text : "");
    return 1;
  }
  checkFi(static_cast<int>(n), "fi_cq_read");
  return 0;
}

}  // namespace smddp
