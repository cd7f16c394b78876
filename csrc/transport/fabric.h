// libfabric setup, one small function per step (getinfo, filter, fabric,
// domain), with every fid_* held by an owner whose deleter calls fi_close so
// no error path leaks. The Endpoint (endpoint.h) builds on a Fabric.
#pragma once

#include <rdma/fabric.h>

#include <memory>
#include <string>
#include <vector>

namespace smddp {

struct FidCloser {
  void operator()(fid* f) const;
};
template <typename T>
struct FidDeleter {
  void operator()(T* p) const { FidCloser{}(p ? &p->fid : nullptr); }
};
template <typename T>
using FidPtr = std::unique_ptr<T, FidDeleter<T>>;

struct FiInfoDeleter {
  void operator()(fi_info* i) const { fi_freeinfo(i); }
};
using FiInfoPtr = std::unique_ptr<fi_info, FiInfoDeleter>;

// Throws kTransport with the libfabric error string when rc < 0.
void checkFi(int rc, const char* call);

// The provider the group should use: SMDDP_FI_PROVIDER when set, else
// "shm" when every rank is on this host, else "tcp;ofi_rxm". `why` says
// how the choice was made.
std::string chooseProvider(bool allRanksOnOneHost, std::string* why);

// The interface and address a provider would use on this machine (its
// first fi_info; FI_TCP_IFACE restricts tcp to one interface), for
// `python -m torch_smddp.info`. Empty fields when it has none.
struct ProviderAddress {
  std::string interface;  // domain name: the interface for tcp
  std::string address;    // numeric IP, when the provider uses sockets
};
ProviderAddress providerAddress(const std::string& provider);

// Providers libfabric reports on this machine that can serve tagged RDM.
std::vector<std::string> availableProviders();
std::string libfabricVersion();

class Fabric {
 public:
  explicit Fabric(const std::string& provider);
  const std::string& provider() const { return provider_; }
  fi_info* info() const { return info_.get(); }
  fid_domain* domain() const { return domain_.get(); }

 private:
  std::string provider_;
  FiInfoPtr info_;
  FidPtr<fid_fabric> fabric_;
  FidPtr<fid_domain> domain_;
};

}  // namespace smddp
