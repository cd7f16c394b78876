#include "transport/fabric.h"

#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

#include "common/error.h"
#include "common/param.h"
#include "transport/socket_address.h"

namespace smddp {

SMDDP_PARAM_STRING(paramProvider, "SMDDP_FI_PROVIDER", "",
                   "libfabric provider to use (shm, tcp;ofi_rxm, efa, ...); empty = shm on one "
                   "host, tcp;ofi_rxm across hosts")

void FidCloser::operator()(fid* f) const {
  if (f) fi_close(f);
}

void checkFi(int rc, const char* call) {
  if (rc < 0) {
    throwError(ErrorKind::kTransport,
               std::string(call) + " failed: " + fi_strerror(-rc) + " (" + std::to_string(rc) + ")");
  }
}

namespace {

FiInfoPtr makeHints(const std::string& provider) {
  FiInfoPtr hints(fi_allocinfo());
  SMDDP_CHECK(hints, kTransport, "fi_allocinfo failed");
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_TAGGED | FI_DIRECTED_RECV;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->domain_attr->threading = FI_THREAD_SAFE;
  hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  hints->tx_attr->msg_order = FI_ORDER_SAS;
  hints->rx_attr->msg_order = FI_ORDER_SAS;
  if (!provider.empty()) hints->fabric_attr->prov_name = strdup(provider.c_str());
  return hints;
}

// Our defaults for libfabric's providers. Defaults only: a value the user
// set wins. Set before the process's first fi_getinfo, since a provider
// reads some of its variables once, when that call loads it.
//
// rxm over tcp, as libfabric 1.17 ships it, sends a message above 16 KiB
// in segments through bounce buffers (SAR) or by rendezvous, and copies
// even eager ones into a bounce buffer first. A cross-host step's piece is
// 64-128 KiB (a 256 KiB slot over 2-4 hosts): sent eager, from the
// caller's buffer, a 4 x 2 cluster at 2 Gbit/s moves 64 MiB at 85-90% of
// the link bound instead of 70-85% (docs/notes/2026-11-rxm-eager-limit.md).
// rxm reads these two when it opens an endpoint (FI_LOG_LEVEL=info prints
// "Protocol limits: Eager: 262144").
//
// rxm also makes FI_OFI_RXM_MSG_RX_SIZE receive buffers for its endpoint
// and for each connection, read when the provider loads. At the default
// of 128, opening an endpoint took 20-60 ms in a training process, most of
// the 45-65 ms in which a torchft survivor formed its new group after a
// replica died (Gloo: 1 ms); at 16, 10-14 ms. Our receives are posted
// before their data arrives, so these buffers only take control frames and
// data that beats its receive, and a full queue only holds the sender back:
// at 2 Gbit the cross-host allreduce reached the same share of the link
// from 64 KiB to 64 MiB with 16 as with 128
// (docs/notes/2026-11-25-group-formation.md).
void libfabricDefaults() {
  static std::once_flag once;
  std::call_once(once, [] {
    setenv("FI_OFI_RXM_EAGER_LIMIT", "262144", 0);
    setenv("FI_OFI_RXM_ENABLE_DIRECT_SEND", "1", 0);
    setenv("FI_OFI_RXM_MSG_RX_SIZE", "16", 0);
  });
}

// getinfo, keeping only entries whose provider name matches exactly (the
// "tcp" request must not silently come back as "tcp;ofi_rxm" or vice versa).
FiInfoPtr getInfo(const std::string& provider) {
  libfabricDefaults();
  FiInfoPtr hints = makeHints(provider);
  fi_info* raw = nullptr;
  int rc = fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, hints.get(), &raw);
  if (rc == -FI_ENODATA || raw == nullptr) {
    throwError(ErrorKind::kTransport,
               "libfabric provider '" + provider +
                   "' is not available for tagged RDM endpoints on this machine "
                   "(check `fi_info -l`, or set SMDDP_FI_PROVIDER)");
  }
  checkFi(rc, "fi_getinfo");
  FiInfoPtr all(raw);
  for (fi_info* i = raw; i; i = i->next) {
    if (provider.empty() || provider == i->fabric_attr->prov_name) {
      FiInfoPtr one(fi_dupinfo(i));
      SMDDP_CHECK(one, kTransport, "fi_dupinfo failed");
      return one;
    }
  }
  throwError(ErrorKind::kTransport, "libfabric offered no entry for provider '" + provider + "'");
}

}  // namespace

std::string chooseProvider(bool allRanksOnOneHost, std::string* why) {
  std::string forced = paramProvider();
  if (!forced.empty()) {
    if (why) *why = "SMDDP_FI_PROVIDER=" + forced;
    return forced;
  }
  if (allRanksOnOneHost) {
    if (why) *why = "all ranks report the same host: shared memory";
    return "shm";
  }
  if (why) *why = "ranks span several hosts: tcp with the rxm reliability layer";
  return "tcp;ofi_rxm";
}

std::vector<std::string> availableProviders() {
  libfabricDefaults();
  FiInfoPtr hints = makeHints("");
  fi_info* raw = nullptr;
  std::vector<std::string> out;
  if (fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, hints.get(), &raw) != 0 || !raw) {
    return out;
  }
  FiInfoPtr all(raw);
  std::set<std::string> seen;
  for (fi_info* i = raw; i; i = i->next) {
    if (seen.insert(i->fabric_attr->prov_name).second) out.push_back(i->fabric_attr->prov_name);
  }
  return out;
}

ProviderAddress providerAddress(const std::string& provider) {
  ProviderAddress out;
  FiInfoPtr info = getInfo(provider);
  if (info->domain_attr && info->domain_attr->name) out.interface = info->domain_attr->name;
  out.address = numericAddress(info->src_addr, info->src_addrlen);
  return out;
}

std::string libfabricVersion() {
  uint32_t v = fi_version();
  return std::to_string(FI_MAJOR(v)) + "." + std::to_string(FI_MINOR(v));
}

Fabric::Fabric(const std::string& provider) : provider_(provider), info_(getInfo(provider)) {
  fid_fabric* fabric = nullptr;
  checkFi(fi_fabric(info_->fabric_attr, &fabric, nullptr), "fi_fabric");
  fabric_.reset(fabric);
  fid_domain* domain = nullptr;
  checkFi(fi_domain(fabric_.get(), info_.get(), &domain, nullptr), "fi_domain");
  domain_.reset(domain);
}

}  // namespace smddp
