// libfabric setup, one small function per step (getinfo, filter, fabric,
// domain), with every fid_* held by an owner whose deleter calls fi_close so
// no error path leaks, and the choice of the provider (SMDDP_FI_PROVIDER
// under libfabric's FI_PROVIDER). The Endpoint (endpoint.h) builds on a Fabric.
#pragma once

#include <rdma/fabric.h>

#include <memory>
#include <string>

#include "common/wire_limits.h"  // kRxmEagerLimitBytes
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

// FI_PROVIDER as libfabric (1.17 and later, src/fabric.c) reads it: a
// comma-separated list of provider names, matched without regard to case
// and without trimming; a leading '^' makes the whole list one to exclude.
// libfabric hides every provider the filter does not allow: unset allows
// all, set but empty none. A layered name ("tcp;ofi_rxm") passes when
//  - included: its core provider is listed, alone or as the start of a
//    layered name ("tcp", "tcp;ofi_rxm"; a utility provider such as ofi_rxm
//    need not be), and the whole name is listed or starts with a listed
//    name and ';' ("tcp" allows "tcp;ofi_rxm", "tcp;ofi_rxd" does not);
//  - excluded: none of its layers is listed, and neither is the whole name
//    nor a listed name it starts with ("^ofi_rxm" and "^tcp;ofi_rxm" both
//    hide "tcp;ofi_rxm").
class ProviderFilter {
 public:
  ProviderFilter() = default;  // FI_PROVIDER unset
  explicit ProviderFilter(std::string value);
  // FI_PROVIDER as this process's libfabric read it: the value at smddp's
  // first libfabric call (libfabric reads it once, when that call loads
  // the providers), or now when there was none yet.
  static ProviderFilter fromEnvironment();
  bool set() const { return set_; }
  const std::string& value() const { return value_; }
  bool allows(const std::string& provider) const;
  // "FI_PROVIDER=efa", "FI_PROVIDER='tcp;ofi_rxm'", "FI_PROVIDER=''": as a shell takes it.
  std::string shown() const;

 private:
  bool set_ = false;
  std::string value_;
  bool excludes_ = false;
  std::vector<std::string> names_;
};

// What the group's provider depends on.
struct ProviderRequest {
  std::string forced;     // SMDDP_FI_PROVIDER; empty: smddp chooses
  ProviderFilter filter;  // FI_PROVIDER
  bool oneHost = true;    // every rank reports the same host
  std::string noShm;      // why not shm although on one host ("": no reason)
};

struct ProviderChoice {
  std::string provider;
  std::string why;      // how the choice was made, for the group's description
  bool forced = false;  // SMDDP_FI_PROVIDER named it
};

// The rule (docs/configuration.md, "FI_PROVIDER and SMDDP_FI_PROVIDER"):
//  1. SMDDP_FI_PROVIDER, when set, is the provider, if FI_PROVIDER allows it.
//  2. Otherwise smddp's own order for where the ranks are: shm on one host
//     (unless `noShm`), then tcp;ofi_rxm, then efa; the first FI_PROVIDER
//     allows, and the reason then says what FI_PROVIDER did.
// Throws kInvalidArgument when FI_PROVIDER hides SMDDP_FI_PROVIDER's
// provider, or every provider of step 2: one message that names both
// variables, their values and the fix. Pure: no environment, no libfabric.
ProviderChoice chooseProvider(const ProviderRequest& request);

// The request from this process's SMDDP_FI_PROVIDER and FI_PROVIDER.
ProviderRequest providerRequest(bool allRanksOnOneHost);

// The interface and address a provider would use on this machine (its
// first fi_info; FI_TCP_IFACE restricts tcp to one interface), for
// `python -m torch_smddp.info`. Empty fields when it has none.
struct ProviderAddress {
  std::string interface;  // domain name: the interface for tcp
  std::string address;    // numeric IP, when the provider uses sockets
};
ProviderAddress providerAddress(const std::string& provider);

// Providers libfabric reports on this machine that can serve tagged RDM
// (those FI_PROVIDER hides are not among them).
std::vector<std::string> availableProviders();
// fi_version() of the libfabric this process runs, "major.minor".
std::string libfabricVersion();
// The file that libfabric was loaded from in this process (the one
// fi_getinfo lives in, symlinks resolved): with several installed (the
// system's, /opt/amazon/efa, a wheel's) the one that runs, which need not
// be the one the build linked.
std::string loadedLibfabricPath();

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
