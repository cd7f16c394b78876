// torch_smddp._C: the pybind module. It exposes the backend class (so
// torch_smddp can register it with torch.distributed) and read-only
// introspection used by `python -m torch_smddp.info` and stats().
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "backend/device_context.h"
#include "backend/process_group.h"
#include "backend/store_bootstrap.h"
#include "common/param.h"
#include "hostpath/allreduce_paths.h"
#include "hostpath/host_path.h"
#include "hostpath/shared_pool.h"
#include "observe/flight_recorder.h"
#include "reduce/reduce_kernels.h"
#include "server/server_auth.h"
#include "server/standalone_server.h"
#include "observe/stats.h"
#include "observe/timeline.h"
#include "transport/fabric.h"
#include "transport/socket_address.h"
#include "transport/spare_endpoints.h"

namespace py = pybind11;
using c10d_smddp::GroupInspector;
using c10d_smddp::ProcessGroupSmddp;

namespace c10d_smddp {
void bindSimTesting(py::module_& m);  // module_sim.cc
}

namespace {

// pybind's holder for the backend: it drops its reference with the GIL
// released. The last reference runs ~ProcessGroupSmddp, which joins the
// engine thread, and that thread may need the GIL right then: it frees the
// Works and tensors of the calls it ran, and freeing a tensor whose Python
// object has already gone decrefs that object (torch keeps it alive for the
// C++ side), which takes the GIL. Joining with the GIL held deadlocked
// `del pg` on a directly constructed group. torch binds its own backends
// the same way (IntrusivePtrNoGilDestructor, torch/csrc/distributed/c10d/
// init.cpp); this holder has the same layout, one intrusive_ptr, so torch
// code that takes the object as a c10d::Backend reads it alike.
template <typename T>
class NoGilHolder {
 public:
  NoGilHolder() = default;
  NoGilHolder(const NoGilHolder&) = default;
  NoGilHolder(NoGilHolder&&) noexcept = default;
  NoGilHolder& operator=(const NoGilHolder&) = default;
  NoGilHolder& operator=(NoGilHolder&&) noexcept = default;
  NoGilHolder(c10::intrusive_ptr<T> impl) : impl_(std::move(impl)) {}  // NOLINT: implicit on purpose
  explicit NoGilHolder(T* impl) : impl_(c10::intrusive_ptr<T>::unsafe_steal_from_new(impl)) {}
  ~NoGilHolder() {
    if (!impl_) return;
    if (PyGILState_Check()) {
      py::gil_scoped_release release;
      impl_.reset();
    } else {
      impl_.reset();
    }
  }
  T& operator*() const noexcept { return *impl_; }
  T* operator->() const noexcept { return impl_.get(); }
  T* get() const noexcept { return impl_.get(); }

 private:
  c10::intrusive_ptr<T> impl_;
};

}  // namespace

PYBIND11_DECLARE_HOLDER_TYPE(T, NoGilHolder<T>, true)

namespace {

// Runs make() with the GIL released and returns what it built, the GIL
// held again. A factory py::init must not release the GIL with
// py::call_guard: the guard stays released while pybind registers the new
// instance in its instance map, which only the GIL guards, and a thread
// creating or freeing pybind objects meanwhile corrupts the map
// ("pybind11_object_dealloc(): Tried to deallocate unregistered instance!",
// pybind/pybind11#5473; torchft configures groups on a thread of its own).
template <typename Make>
auto releaseWhile(Make&& make) {
  py::gil_scoped_release release;
  return make();
}

// Runs f(); a bad SMDDP_* or FI_PROVIDER value (kInvalidArgument) reaches
// Python as a ValueError with its message.
template <typename F>
auto unlessInvalid(F&& f) {
  try {
    return f();
  } catch (const smddp::Error& e) {
    if (e.kind() == smddp::ErrorKind::kInvalidArgument) throw py::value_error(e.what());
    throw;
  }
}

py::dict statsToDict(const smddp::Stats& s) {
  py::dict d;
  d["bytes_sent"] = s.bytesSent;
  d["bytes_received"] = s.bytesReceived;
  d["collectives"] = s.collectives;
  d["fusion_buffers_flushed"] = s.fusionFlushes;
  d["fusion_bytes"] = s.fusionBytes;
  d["fusion_mean_fill_bytes"] = s.fusionFlushes ? double(s.fusionBytes) / s.fusionFlushes : 0.0;
  d["fused_calls"] = s.fusedCalls;
  d["fused_calls_per_buffer"] = s.fusionFlushes ? double(s.fusedCalls) / s.fusionFlushes : 0.0;
  d["chunks_in_flight_max"] = s.chunksInFlightMax;
  d["server_reduce_seconds"] = s.serverReduceNs / 1e9;
  d["frames_rejected"] = s.framesRejected;
  d["errors"] = s.errors;
  d["abandoned_sends"] = s.abandonedSends;
  d["abandoned_sends_confirmed"] = s.abandonedSendsConfirmed;
  d["abandoned_sends_held"] = s.abandonedSendsHeld;
  d["calls_run_by_caller"] = s.callerRuns;
  d["direct_calls"] = s.directCalls;
  d["small_batches"] = s.smallBatches;
  d["standalone_server_bytes"] = s.standaloneServerBytes;
  d["standalone_server_steps"] = s.standaloneServerSteps;
  d["rounds_calls"] = s.roundsCalls;
  d["pool_read_bytes"] = s.poolReadBytes;
  d["early_gathers"] = s.earlyGathers;
  d["bytes_sealed"] = s.bytesSealed;
  d["bytes_opened"] = s.bytesOpened;
  return d;
}

py::dict entryToDict(const smddp::FlightEntry& e, int64_t steadyNowNs, int64_t wallNowUs) {
  auto wall = [&](int64_t ns) -> py::object {
    if (!ns) return py::none();
    return py::float_((wallNowUs - (steadyNowNs - ns) / 1000) / 1e6);
  };
  py::dict d;
  d["seq"] = e.seq;
  d["collective"] = e.hasSignature ? smddp::toString(e.sig.collective) : "barrier";
  d["call"] = e.describe();
  d["dtype"] = e.hasSignature ? py::object(py::str(smddp::toString(e.sig.dtype))) : py::none();
  d["op"] = e.hasSignature ? py::object(py::str(smddp::toString(e.sig.op))) : py::none();
  d["numel"] = e.hasSignature ? e.sig.numel : 0;
  d["root"] = e.hasSignature && e.sig.root >= 0 ? py::object(py::int_(e.sig.root)) : py::none();
  d["bytes"] = e.bytes();
  d["state"] = smddp::toString(e.state);
  d["path"] = smddp::toString(e.path);
  d["batch"] = e.batch;
  d["batch_calls"] = e.batchCalls;
  d["on_caller"] = e.onCaller;
  d["queued"] = wall(e.queuedNs);  // wall-clock seconds (time.time()), or None
  d["started"] = wall(e.startedNs);
  d["ended"] = wall(e.endedNs);
  d["error"] = e.error.empty() ? py::object(py::none()) : py::object(py::str(e.error));
  return d;
}

}  // namespace

namespace {

// The servers a store listed ("host:port" each): parsed as the variable
// would be, each named by its key in the store (`origin` + index).
smddp::RegisteredServers registeredServers(const std::vector<std::string>& hosts,
                                           const std::string& origin, const std::string& key) {
  smddp::RegisteredServers r;
  for (size_t i = 0; i < hosts.size(); ++i) {
    auto one = smddp::parseServerHosts(hosts[i]);
    if (one.size() != 1) {
      TORCH_CHECK_VALUE(false, "smddp: the store lists '", hosts[i], "' as ", origin, i,
                        ", not one host:port");
    }
    one[0].origin = origin + std::to_string(i);
    r.hosts.push_back(one[0]);
  }
  r.key = key;
  return r;
}

// Who issued the recent collectives last (hostpath/arrivals.h): calls,
// window, ranks (those covered) and rows, most wait caused first; None
// where the group's path cannot tell.
py::object stragglersToDict(const smddp::Stragglers& st) {
  if (st.rows.empty()) return py::none();
  py::dict s;
  s["calls"] = st.calls;
  s["window"] = st.window;
  py::list ranks;
  std::vector<smddp::StragglerRow> rows = st.rows;
  for (const auto& r : rows) ranks.append(r.rank);
  std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    return a.causedNs != b.causedNs ? a.causedNs > b.causedNs : a.last > b.last;
  });
  py::list out;
  for (const auto& r : rows) {
    py::dict row;
    row["rank"] = r.rank;
    row["last"] = r.last;
    row["share"] = st.calls ? static_cast<double>(r.last) / static_cast<double>(st.calls) : 0.0;
    row["caused_ms"] = static_cast<double>(r.causedNs) / 1e6;
    out.append(row);
  }
  s["ranks"] = ranks;
  s["rows"] = out;
  return s;
}

py::dict groupStats(const ProcessGroupSmddp& pg) {
  const GroupInspector& g = pg.inspect();
  py::dict d = statsToDict(g.stats());
  d["allreduce_path"] = g.allreducePath();
  d["allreduce_schedule"] = g.allreduceSchedule();
  d["gather_scatter_path"] = g.gatherScatterPath();
  // The process's pool, every group's share of it: allocate_tensor's
  // tensors and the ranges kept for staging.
  d["pool_bytes_in_use"] =
      smddp::SharedPool::where().base ? smddp::SharedPool::process().inUse() : uint64_t{0};
  d["reduction_servers"] = g.reductionServers();
  d["ring_depth"] = g.ringDepth();
  d["standalone_servers"] = g.standaloneServers();
  d["device_calls"] = g.deviceCalls();
  d["intra_route"] = g.intraRoute();
  d["device_host_group"] = g.deviceHostGroup();
  d["stragglers"] = stragglersToDict(g.stragglers());
  // Per collective: calls, and per size class (power-of-4 bytes)
  // the count and latency (queued to completed) percentiles, read
  // from log-spaced bins (within a factor sqrt(2)).
  py::dict counts;
  py::dict latency;
  for (const auto& c : g.latencyStats()) {
    const char* name = smddp::toString(static_cast<smddp::CollectiveType>(c.collective));
    py::str key(name);
    counts[key] = (counts.contains(key) ? counts[key].cast<uint64_t>() : 0) + c.count;
    if (!latency.contains(key)) latency[key] = py::list();
    py::dict cell;
    const uint64_t lo = c.sizeClass == 0 ? 0 : uint64_t{1} << (2 * c.sizeClass);
    cell["size_class"] = c.sizeClass;
    cell["min_bytes"] = lo;
    cell["max_bytes"] = c.sizeClass == smddp::LatencyHistograms::kSizeClasses - 1
                            ? py::object(py::none())
                            : py::object(py::int_((uint64_t{1} << (2 * c.sizeClass + 2)) - 1));
    cell["count"] = c.count;
    cell["mean_us"] = c.meanUs;
    cell["p50_us"] = c.p50Us;
    cell["p99_us"] = c.p99Us;
    latency[key].cast<py::list>().append(cell);
  }
  d["collective_counts"] = counts;
  d["latency"] = latency;
  return d;
}

// ProcessGroupSmddp(...) from Python. server_hosts/server_key: the
// standalone reduction servers torch_smddp found in a store ("host:port"
// each, in server order) and the job's key from there; None:
// SMDDP_SERVER_HOSTS decides. cross_host_dtype: torch_smddp.Options'; "":
// SMDDP_CROSS_HOST_DTYPE. keep_spare: the process forms groups again and
// again (torchft): keep a warm endpoint for the next
// (GroupOptions::keepSpare).
NoGilHolder<ProcessGroupSmddp> makeGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                         int size, std::chrono::milliseconds timeout,
                                         std::string name,
                                         std::optional<std::vector<std::string>> serverHosts,
                                         const std::string& serverOrigin,
                                         const std::string& serverKey,
                                         std::shared_ptr<c10d_smddp::FormationCancel> cancel,
                                         std::string crossHostDtype, bool keepSpare) {
  c10d_smddp::GroupOptions options;
  if (serverHosts) options.servers = registeredServers(*serverHosts, serverOrigin, serverKey);
  options.cancel = std::move(cancel);
  options.crossHostDtype = std::move(crossHostDtype);
  options.keepSpare = keepSpare;
  // Forming the group waits on its peers, so it runs without the GIL;
  // pybind then registers the instance, which needs the GIL back
  // (releaseWhile).
  return releaseWhile([&] {
    return NoGilHolder<ProcessGroupSmddp>(c10::make_intrusive<ProcessGroupSmddp>(
        store, rank, size, timeout, std::move(name), std::move(options)));
  });
}

// The flight recorder's entries, oldest first (torch_smddp.flight_recorder).
py::list flightRecorderEntries(const ProcessGroupSmddp& pg) {
  py::list out;
  auto rec = pg.inspect().flightRecorder();
  if (!rec) return out;
  const auto steadyNow = std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::steady_clock::now().time_since_epoch())
                             .count();
  const auto wallNow = std::chrono::duration_cast<std::chrono::microseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  for (const auto& e : rec->entries()) out.append(entryToDict(e, steadyNow, wallNow));
  return out;
}

// A GroupInspector accessor (no arguments) as a method or property of the
// group's Python object.
template <auto Get>
auto inspected() {
  return [](const ProcessGroupSmddp& pg) { return (pg.inspect().*Get)(); };
}

// The process group and what it needs from Python: the formation cancel
// token, the group, and the atexit hook that stops live groups.
void bindProcessGroup(py::module_& m) {
  // Handed to a group's constructor, cancel() from another thread stops
  // it forming: the constructor then raises within a few ms
  // (store_bootstrap.h). torch_smddp.torchft's abort() uses it.
  py::class_<c10d_smddp::FormationCancel, std::shared_ptr<c10d_smddp::FormationCancel>>(
      m, "FormationCancel")
      .def(py::init<>())
      .def("cancel", &c10d_smddp::FormationCancel::cancel)
      .def_property_readonly("cancelled", &c10d_smddp::FormationCancel::cancelled);
  py::class_<ProcessGroupSmddp, c10d::Backend, NoGilHolder<ProcessGroupSmddp>>(
      m, "ProcessGroupSmddp")
      .def(py::init(&makeGroup),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::arg("group_name") = "default", py::arg("server_hosts") = py::none(),
           py::arg("server_origin") = "", py::arg("server_key") = "",
           py::arg("cancel") = py::none(), py::arg("cross_host_dtype") = "",
           py::arg("keep_spare") = false)
      // The group's asynchronous error as text, or None (async_error.h),
      // and its c10d ErrorType (Backend::getError: SUCCESS, TIMEOUT,
      // COMM_ERROR), which torch binds only for its own backends.
      .def("errored", inspected<&GroupInspector::errorMessage>())
      .def("get_error", &ProcessGroupSmddp::getError)
      // Both join the engine thread, which may need the GIL (see NoGilHolder).
      .def("shutdown", &ProcessGroupSmddp::shutdown, py::call_guard<py::gil_scoped_release>())
      .def("abort", &ProcessGroupSmddp::abort, py::call_guard<py::gil_scoped_release>())
      .def("stats", &groupStats)
      .def("flight_recorder", &flightRecorderEntries)
      // dist.ReduceOp.SUM and the like are RedOpType values: taken as such,
      // they skip the conversion to a ReduceOp object (an allocation per
      // call); a ReduceOp object (PREMUL_SUM) takes the second overload.
      .def("all_reduce_now",
           [](ProcessGroupSmddp& pg, at::Tensor& t, c10d::ReduceOp::RedOpType op) {
             return pg.allreduceNow(t, c10d::ReduceOp(op));
           },
           py::arg("tensor"), py::arg("op"), py::call_guard<py::gil_scoped_release>())
      .def("all_reduce_now", &ProcessGroupSmddp::allreduceNow, py::arg("tensor"), py::arg("op"),
           py::call_guard<py::gil_scoped_release>())
      .def("reset_stats", inspected<&GroupInspector::resetStats>())
      .def_property_readonly("provider", inspected<&GroupInspector::provider>())
      .def_property_readonly("provider_reason", inspected<&GroupInspector::providerReason>())
      .def_property_readonly("liveness_peers", inspected<&GroupInspector::livenessPeers>())
      .def("lost_ranks", inspected<&GroupInspector::lostRanks>())
      // Where this group instance's keys live in its store (tests read them).
      .def_property_readonly("store_prefix", inspected<&GroupInspector::storePrefix>())
      // How torch's flight recorder format names the group (its desc and
      // global ranks), for TORCH_FR_DUMP_TEMP_FILE dumps.
      // dist.shrink_group calls backend.shrink(ranks, flags, pg_options):
      // this one takes torch_smddp.Options too, and forms the new group
      // without the GIL (it waits on the other survivors).
      .def("shrink",
           [](ProcessGroupSmddp& pg, std::vector<int64_t> ranks, int flags, py::object options) {
             std::optional<std::string> dtype;
             if (!options.is_none()) {
               if (!py::hasattr(options, "cross_host_dtype")) {
                 throw py::type_error("smddp shrink takes pg_options=torch_smddp.Options(...)");
               }
               py::object d = options.attr("cross_host_dtype");
               if (!d.is_none()) dtype = d.cast<std::string>();
             }
             return releaseWhile([&] {
               return NoGilHolder<ProcessGroupSmddp>(pg.shrinkTo(std::move(ranks), flags, dtype));
             });
           },
           py::arg("ranks_to_exclude"), py::arg("shrink_flags") = 0,
           py::arg("pg_options") = py::none())
      .def("_set_torch_group", [](ProcessGroupSmddp& pg, const std::string& desc,
                                  const std::vector<int>& globalRanks) {
        if (auto rec = pg.inspect().flightRecorder()) rec->setTorchGroup(desc, globalRanks);
      });

  // A group still alive when Python finalizes is freed late in
  // finalization, when no other thread may take the GIL any more: an engine
  // thread that then frees a Python-owned tensor is ended by Python inside
  // a C++ destructor (std::terminate). atexit hooks run while threads still
  // can: stop every live group there, with the GIL released.
  py::module_::import("atexit").attr("register")(py::cpp_function(
      [] { ProcessGroupSmddp::shutdownAll(); }, py::call_guard<py::gil_scoped_release>()));

}

// The parameters (torch_smddp.info, docs/configuration.md), the server
// lookup and the desync report.
void bindParamsAndReports(py::module_& m) {
  // What torch_smddp looks the standalone reduction servers up with, read
  // and checked where the variables are declared (hostpath/host_path.h).
  m.def("server_lookup", [] {
    smddp::ServerLookup l;
    try {
      l = smddp::serverLookupParams();
    } catch (const smddp::Error& e) {
      throw py::value_error(e.what());
    }
    py::dict d;
    d["count"] = l.count;
    d["job"] = l.job;
    d["rendezvous"] = l.rendezvous;
    d["hosts_given"] = l.hostsGiven;
    return d;
  });
  // SMDDP_SERVER_KEY_FILE, the default of python -m torch_smddp.server --key-file.
  m.def("server_key_file", &smddp::serverKeyFileParam);
  // SMDDP_SERVER_INSECURE, which python -m torch_smddp.server needs for a
  // key kept in the store.
  m.def("server_insecure", &smddp::serverInsecureParam);
  m.def("params", [] {
    py::list out;
    for (const auto& p : smddp::allParams()) {
      out.append(py::make_tuple(p.env, p.type, p.defaultValue, p.doc));
    }
    return out;
  });
  // The same, with where each is declared and its range, for
  // `python -m torch_smddp.info --markdown` (docs/configuration.md).
  m.def("param_specs", [] {
    py::list out;
    for (const auto& p : smddp::allParams()) {
      py::dict d;
      d["name"] = p.env;
      d["type"] = p.type;
      d["default"] = p.defaultValue;
      d["doc"] = p.doc;
      d["file"] = p.file;
      d["min"] = p.ranged ? py::cast(p.lo) : py::none();
      d["max"] = p.ranged ? py::cast(p.hi) : py::none();
      out.append(d);
    }
    return out;
  });
  // The desync report from each rank's serialized position (a dump's
  // "position"; None for a rank with no dump): `python -m torch_smddp.trace
  // analyze` prints the same text a failing call carries.
  m.def("desync_report", [](const std::vector<std::optional<std::string>>& positions) {
    std::vector<smddp::RankPosition> ps;
    for (size_t r = 0; r < positions.size(); ++r) {
      smddp::RankPosition p;
      if (positions[r]) {
        p = smddp::RankPosition::parse(static_cast<int>(r), *positions[r]);
      } else {
        p.rank = static_cast<int>(r);
        p.kind = smddp::RankPosition::Kind::kUnreachable;
      }
      ps.push_back(p);
    }
    return smddp::formatDesyncReport(ps);
  });
}

// python -m torch_smddp.server (torch_smddp/server.py): the torch-free
// standalone reduction servers, run on threads of their own. The key:
// `key` (the job's, from a store), else the file at `key_file`, else
// SMDDP_SERVER_KEY_FILE; a bad or missing one raises ValueError naming
// where it came from.
void bindStandaloneServer(py::module_& m) {
  py::class_<smddp::StandaloneServer>(m, "StandaloneServer")
      .def(py::init([](const std::string& bind, int basePort, int count, const std::string& job,
                       const std::string& keyFile, const std::string& key,
                       const std::vector<std::string>& advertise) {
             smddp::StandaloneServer::Options o;
             o.bindAddress = bind;
             o.basePort = basePort;
             o.count = count;
             o.job = job;
             o.keyFile = keyFile;
             o.key = key;
             o.advertise = advertise;
             try {
               return releaseWhile([&] { return std::make_unique<smddp::StandaloneServer>(o); });
             } catch (const smddp::Error& e) {
               if (e.kind() == smddp::ErrorKind::kInvalidArgument) throw py::value_error(e.what());
               throw;
             }
           }),
           py::arg("bind"), py::arg("base_port"), py::arg("count"), py::arg("job"),
           py::arg("key_file") = "", py::arg("key") = "",
           py::arg("advertise") = std::vector<std::string>{})
      .def_property_readonly("ports", &smddp::StandaloneServer::ports)
      .def("stop", &smddp::StandaloneServer::stop, py::call_guard<py::gil_scoped_release>())
      .def("pieces_reduced", &smddp::StandaloneServer::piecesReduced)
      .def("bytes_reduced", &smddp::StandaloneServer::bytesReduced)
      .def("refused", &smddp::StandaloneServer::refused)
      .def("connections", &smddp::StandaloneServer::connections)
      .def("streams", &smddp::StandaloneServer::streams)
      .def("threads", &smddp::StandaloneServer::threads)
      .def("last_error", &smddp::StandaloneServer::lastError);
}

// What torch_smddp.info shows, and the tests' views of this process.
void bindInfo(py::module_& m) {
  m.def("default_address", &smddp::fallbackAddress);
  m.def("libfabric_version", &smddp::libfabricVersion);
  // Spare endpoints of this process (transport/spare_endpoints.h), for tests.
  m.def("spare_endpoint_counts", [] {
    const smddp::SpareCounts c = smddp::spareEndpointCounts();
    py::dict d;
    d["ready"] = c.ready;
    d["opening"] = c.opening;
    d["waiting"] = c.waiting;
    d["taken"] = c.taken;
    return d;
  });
  m.def("available_providers", &smddp::availableProviders);
  // The provider a group would take with this process's SMDDP_FI_PROVIDER
  // and FI_PROVIDER (ValueError when they conflict), and why.
  m.def("choose_provider", [](bool oneHost) {
    smddp::ProviderChoice c = unlessInvalid([&] {
      return smddp::chooseProvider(smddp::providerRequest(oneHost));
    });
    return py::make_tuple(c.provider, c.why);
  });
  // The FI_PROVIDER smddp judges by, as libfabric read it (None: unset).
  m.def("fi_provider_filter", [] {
    smddp::ProviderFilter f = smddp::ProviderFilter::fromEnvironment();
    return f.set() ? py::object(py::str(f.value())) : py::object(py::none());
  });
  // The libfabric file this process runs (not the one linked at build time).
  m.def("loaded_libfabric", &smddp::loadedLibfabricPath);
  // What a host's shared-memory segment takes for `local_world` ranks per
  // host over `hosts` hosts with this process's SMDDP_* settings (info's
  // /dev/shm check).
  m.def("host_segment_need", [](int localWorld, int hosts) {
    if (localWorld < 1 || hosts < 1) {
      throw py::value_error("host_segment_need: local_world and hosts must be >= 1, got " +
                            std::to_string(localWorld) + " and " + std::to_string(hosts));
    }
    const smddp::EngineConfig c = unlessInvalid([] { return smddp::readEngineConfig(); });
    const unsigned cores = smddp::onlineCores();
    const smddp::SegmentGeometry g = smddp::hostSegmentGeometry(c, localWorld, hosts, cores);
    py::dict d;
    d["bytes"] = g.bytes;
    d["servers"] = g.servers;
    d["slot_bytes"] = g.slotBytes;
    d["depth"] = g.depth;
    d["deep"] = g.deep;
    d["cores"] = cores;
    d["unused"] = g.unused;
    return d;
  });
  // The interface and address a provider would take here (info: which one
  // tcp chose, and so where FI_TCP_IFACE must point when it is wrong).
  m.def("provider_address", [](const std::string& provider) {
    smddp::ProviderAddress a = smddp::providerAddress(provider);
    return py::make_tuple(a.interface, a.address);
  });
  m.def("reduce_kernel_isa", &smddp::reduceKernelIsa);
  // SMDDP_TIMELINE: the file this process writes ("" when not recording),
  // and a flush (the file is complete JSON after it).
  m.def("timeline_path", &smddp::timeline::path);
  m.def("timeline_flush", &smddp::timeline::flush, py::call_guard<py::gil_scoped_release>());
  // Latency histogram geometry, for tests: (bin index, low us, high us) of a latency in ns.
  m.def("latency_bin", [](uint64_t ns) {
    const int b = smddp::LatencyHistograms::bin(ns);
    return py::make_tuple(b, smddp::LatencyHistograms::binLowUs(b),
                          smddp::LatencyHistograms::binHighUs(b));
  });
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch-smddp native extension";
  // True when this build has the CUDA path (SMDDP_WITH_CUDA).
  m.def("built_with_cuda", &c10d_smddp::builtWithCuda);
  bindProcessGroup(m);
  bindParamsAndReports(m);
  bindStandaloneServer(m);
  bindInfo(m);
  m.attr("built_with_torch") = SMDDP_BUILT_WITH_TORCH;
  c10d_smddp::bindSimTesting(m);
}
