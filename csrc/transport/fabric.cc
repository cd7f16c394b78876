#include "transport/fabric.h"

#include <dlfcn.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>
#include <strings.h>

#include <cctype>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <set>
#include <string_view>

#include "common/error.h"
#include "common/param.h"
#include "transport/socket_address.h"

namespace smddp {

SMDDP_PARAM_STRING(paramProvider, "SMDDP_FI_PROVIDER", "",
                   "libfabric provider to use (shm, tcp;ofi_rxm, efa, ...); empty = shm on one "
                   "host, tcp;ofi_rxm across hosts, or under FI_PROVIDER the first of shm, "
                   "tcp;ofi_rxm, efa that it allows; one FI_PROVIDER hides fails group creation "
                   "(docs/configuration.md, \"FI_PROVIDER and SMDDP_FI_PROVIDER\")")

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
//
// It also keeps FI_PROVIDER as it is now: libfabric reads it once, when the
// first fi_getinfo loads the providers, and the provider choice must judge
// the filter libfabric applies, not one set later.
std::optional<std::string> providerFilterAtInit;  // written once, under `once` below

void libfabricDefaults() {
  static std::once_flag once;
  std::call_once(once, [] {
    setenv("FI_OFI_RXM_EAGER_LIMIT", std::to_string(kRxmEagerLimitBytes).c_str(), 0);
    setenv("FI_OFI_RXM_ENABLE_DIRECT_SEND", "1", 0);
    setenv("FI_OFI_RXM_MSG_RX_SIZE", "16", 0);
    if (const char* v = std::getenv("FI_PROVIDER")) providerFilterAtInit = v;
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
    const ProviderFilter filter = ProviderFilter::fromEnvironment();
    throwError(ErrorKind::kTransport,
               "libfabric provider '" + provider +
                   "' is not available for tagged RDM endpoints on this machine "
                   "(check `fi_info -l`, or set SMDDP_FI_PROVIDER" +
                   (filter.set() ? "; " + filter.shown() + " is set" : std::string()) + ")");
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

bool sameName(std::string_view a, std::string_view b) {
  return a.size() == b.size() && strncasecmp(a.data(), b.data(), a.size()) == 0;
}

// `layered` is `prefix`, then ';' and more layers ("tcp;ofi_rxm" over "tcp").
bool layeredOver(std::string_view layered, std::string_view prefix) {
  return layered.size() > prefix.size() && layered[prefix.size()] == ';' &&
         sameName(layered.substr(0, prefix.size()), prefix);
}

// As libfabric splits: every piece kept, so "" is one empty name.
std::vector<std::string> splitOn(const std::string& s, char sep) {
  std::vector<std::string> out(1);
  for (char c : s) {
    if (c == sep) out.emplace_back();
    else out.back() += c;
  }
  return out;
}

// libfabric's utility providers (ofi_rxm, ofi_rxd) are named with this prefix.
bool utilityProvider(std::string_view name) {
  return name.size() > 4 && sameName(name.substr(0, 4), "ofi_");
}

// A value as a shell takes it back: quoted when empty or when it holds a
// character the shell would read (';' in "tcp;ofi_rxm").
std::string shellWord(const std::string& v) {
  bool plain = !v.empty();
  for (char c : v) {
    plain = plain && (std::isalnum(static_cast<unsigned char>(c)) || std::strchr("_.,^:+-/", c));
  }
  return plain ? v : "'" + v + "'";
}

std::string joined(const std::vector<std::string>& names, const char* sep) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : sep) + n;
  return out;
}

// smddp's providers for where the ranks are, best first, each with the
// words the group's description gives it.
struct Candidate {
  const char* provider;
  const char* words;
};
constexpr Candidate kShm{"shm", "shared memory"};
constexpr Candidate kTcp{"tcp;ofi_rxm", "tcp with the rxm reliability layer"};
constexpr Candidate kEfa{"efa", "efa"};

// How to get out of a conflict: the providers of smddp's order FI_PROVIDER
// allows on any layout like this one, or where to look.
std::string conflictFix(const ProviderRequest& r) {
  std::vector<std::string> allowed;
  for (const Candidate& c : {kShm, kTcp, kEfa}) {
    const bool fits = r.oneHost || std::string_view(c.provider) != kShm.provider;
    if (fits && r.filter.allows(c.provider)) allowed.push_back(c.provider);
  }
  std::string fix = "unset FI_PROVIDER, or set SMDDP_FI_PROVIDER to a provider FI_PROVIDER allows";
  if (allowed.size() == 1) return fix + " (SMDDP_FI_PROVIDER=" + shellWord(allowed[0]) + ")";
  if (!allowed.empty()) return fix + " (" + joined(allowed, ", ") + ")";
  return fix + " (`FI_PROVIDER=" + shellWord(r.filter.value()) +
         " fi_info -t FI_EP_RDM -c FI_TAGGED` lists them)";
}

}  // namespace

ProviderFilter::ProviderFilter(std::string value) : set_(true), value_(std::move(value)) {
  std::string list = value_;
  if (!list.empty() && list[0] == '^') {
    excludes_ = true;
    list.erase(0, 1);
  }
  names_ = splitOn(list, ',');
}

ProviderFilter ProviderFilter::fromEnvironment() {
  libfabricDefaults();  // takes the value libfabric reads, if it has not yet
  return providerFilterAtInit ? ProviderFilter(*providerFilterAtInit) : ProviderFilter();
}

bool ProviderFilter::allows(const std::string& provider) const {
  if (!set_) return true;
  auto listed = [this](std::string_view name) {
    for (const auto& n : names_) {
      if (sameName(n, name)) return true;
    }
    return false;
  };
  // Some listed name is this provider under more layers ("tcp;ofi_rxm" for tcp).
  auto listedOver = [this](std::string_view core) {
    for (const auto& n : names_) {
      if (layeredOver(n, core)) return true;
    }
    return false;
  };
  // The whole name is listed, or starts with a listed one ("tcp" for tcp;ofi_rxm).
  auto wholeNameListed = [&] {
    for (const auto& n : names_) {
      if (layeredOver(provider, n)) return true;
    }
    return listed(provider);
  };
  const std::vector<std::string> layers = splitOn(provider, ';');
  if (excludes_) {
    // libfabric leaves out every provider the list names, utility ones too,
    // then every entry whose name the list names.
    for (const auto& layer : layers) {
      if (listed(layer)) return false;
    }
    return !wholeNameListed();
  }
  // An include list loads only the core providers it names (a utility
  // provider comes along over any of them), then keeps only the entries it names.
  for (const auto& layer : layers) {
    if (!utilityProvider(layer) && !listed(layer) && !listedOver(layer)) return false;
  }
  return wholeNameListed();
}

std::string ProviderFilter::shown() const { return "FI_PROVIDER=" + shellWord(value_); }

ProviderChoice chooseProvider(const ProviderRequest& r) {
  const ProviderFilter& filter = r.filter;
  const std::string emptyNote = filter.set() && filter.value().empty()
                                    ? " (set but empty, it lets libfabric offer none)"
                                    : "";
  if (!r.forced.empty()) {
    ProviderChoice c{r.forced, "SMDDP_FI_PROVIDER=" + shellWord(r.forced), true};
    if (filter.allows(r.forced)) {
      if (filter.set()) c.why += " (" + filter.shown() + " allows it)";
      return c;
    }
    throwError(ErrorKind::kInvalidArgument,
               "SMDDP_FI_PROVIDER=" + shellWord(r.forced) + " names a provider that " +
                   filter.shown() + emptyNote +
                   " hides: libfabric offers only the providers FI_PROVIDER allows. Fix: " +
                   conflictFix(r));
  }
  std::string where;
  std::vector<Candidate> order;
  if (r.oneHost && r.noShm.empty()) {
    where = "all ranks report the same host";
    order = {kShm, kTcp, kEfa};
  } else {
    where = r.oneHost ? r.noShm : "ranks span several hosts";
    order = {kTcp, kEfa};
  }
  std::vector<std::string> hidden;
  for (const Candidate& c : order) {
    if (!filter.allows(c.provider)) {
      hidden.push_back(c.provider);
      continue;
    }
    std::string why = where;
    if (!hidden.empty()) why += ", but " + filter.shown() + " hides " + joined(hidden, " and ");
    why += std::string(": ") + c.words;
    if (filter.set() && hidden.empty()) why += " (" + filter.shown() + " allows it)";
    return {c.provider, why, false};
  }
  throwError(ErrorKind::kInvalidArgument,
             filter.shown() + emptyNote + " hides every provider smddp chooses from (" + where +
                 ": " + joined(hidden, ", ") +
                 ") and SMDDP_FI_PROVIDER is unset. Fix: " + conflictFix(r));
}

ProviderRequest providerRequest(bool allRanksOnOneHost) {
  ProviderRequest r;
  r.forced = paramProvider();
  r.filter = ProviderFilter::fromEnvironment();
  r.oneHost = allRanksOnOneHost;
  return r;
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

std::string loadedLibfabricPath() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&fi_getinfo), &info) == 0 || !info.dli_fname) return "";
  char real[PATH_MAX];
  return realpath(info.dli_fname, real) ? std::string(real) : std::string(info.dli_fname);
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
