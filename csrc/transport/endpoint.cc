#include "transport/endpoint.h"

#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>

#include "common/error.h"

#include <dirent.h>
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
// (EBUSY). A unique name avoids the clash; regions of dead smddp processes
// are removed before a new one is made.
constexpr const char* kShmPrefix = "smddp-";

void sweepDeadShmRegions() {
  DIR* d = opendir("/dev/shm");
  if (!d) return;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name.rfind(kShmPrefix, 0) != 0) continue;
    long pid = std::strtol(name.c_str() + std::strlen(kShmPrefix), nullptr, 10);
    if (pid <= 0 || pid == getpid()) continue;
    if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      shm_unlink(("/" + name).c_str());
    }
  }
  closedir(d);
}

std::string uniqueShmName() {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%s%d-%llu-%08x", kShmPrefix, static_cast<int>(getpid()),
                static_cast<unsigned long long>(counter++), rd());
  return buf;
}

FidPtr<fid_ep> openEndpoint(fid_domain* domain, fi_info* info, fid_av* av, fid_cq* cq,
                            bool shm) {
  fid_ep* ep = nullptr;
  checkFi(fi_endpoint(domain, info, &ep, nullptr), "fi_endpoint");
  FidPtr<fid_ep> owned(ep);
  if (shm) {
    sweepDeadShmRegions();
    std::string name = uniqueShmName();
    checkFi(fi_setname(&ep->fid, name.data(), name.size() + 1), "fi_setname");
  }
  checkFi(fi_ep_bind(ep, &av->fid, 0), "fi_ep_bind(av)");
  checkFi(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind(cq)");
  checkFi(fi_enable(ep), "fi_enable");
  return owned;
}

}  // namespace

Endpoint::Endpoint(std::shared_ptr<Fabric> fabric) : fabric_(std::move(fabric)) {
  av_ = openAv(fabric_->domain(), 64);
  cq_ = openCq(fabric_->domain());
  ep_ = openEndpoint(fabric_->domain(), fabric_->info(), av_.get(), cq_.get(),
                     fabric_->provider() == "shm");
  maxMsgSize_ = fabric_->info()->ep_attr->max_msg_size;
}

std::string Endpoint::name() const {
  char buf[256];
  size_t len = sizeof(buf);
  checkFi(fi_getname(&ep_->fid, buf, &len), "fi_getname");
  return std::string(buf, len);
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
