// torch_smddp._C: the pybind module. It exposes the backend class (so
// torch_smddp can register it with torch.distributed) and read-only
// introspection used by `python -m torch_smddp.info` and stats().
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "backend/process_group.h"
#include "common/param.h"
#include "engine/reduce_kernels.h"
#include "transport/fabric.h"

namespace py = pybind11;
using c10d_smddp::ProcessGroupSmddp;

namespace {

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
  return d;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch-smddp native extension";
  py::class_<ProcessGroupSmddp, c10d::Backend, c10::intrusive_ptr<ProcessGroupSmddp>>(
      m, "ProcessGroupSmddp")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, std::string name) {
             return c10::make_intrusive<ProcessGroupSmddp>(store, rank, size, timeout,
                                                           std::move(name));
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
           py::arg("group_name") = "default", py::call_guard<py::gil_scoped_release>())
      .def("stats", [](const ProcessGroupSmddp& pg) {
        py::dict d = statsToDict(pg.stats());
        d["allreduce_path"] = pg.allreducePath();
        d["reduction_servers"] = pg.reductionServers();
        return d;
      })
      .def_property_readonly("provider", &ProcessGroupSmddp::provider)
      .def_property_readonly("liveness_peers", &ProcessGroupSmddp::livenessPeers)
      // Where this group instance's keys live in its store (tests read them).
      .def_property_readonly("store_prefix", &ProcessGroupSmddp::storePrefix);

  m.def("params", [] {
    py::list out;
    for (const auto& p : smddp::allParams()) {
      out.append(py::make_tuple(p.env, p.type, p.defaultValue, p.doc));
    }
    return out;
  });
  m.def("libfabric_version", &smddp::libfabricVersion);
  m.def("available_providers", &smddp::availableProviders);
  m.def("choose_provider", [](bool oneHost) {
    std::string why;
    std::string p = smddp::chooseProvider(oneHost, &why);
    return py::make_tuple(p, why);
  });
  // The interface and address a provider would take here (info: which one
  // tcp chose, and so where FI_TCP_IFACE must point when it is wrong).
  m.def("provider_address", [](const std::string& provider) {
    smddp::ProviderAddress a = smddp::providerAddress(provider);
    return py::make_tuple(a.interface, a.address);
  });
  m.def("reduce_kernel_isa", &smddp::reduceKernelIsa);
  m.attr("built_with_torch") = SMDDP_BUILT_WITH_TORCH;
}
