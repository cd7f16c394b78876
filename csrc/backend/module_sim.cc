// torch_smddp._C's bindings of the simulated device (torch_smddp.testing):
// what torch.cuda offers a test, on the stand-in that follows CUDA's rules
// (device/sim_device.h).
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "backend/sim_context.h"
#include "backend/sim_torch_device.h"
#include "common/error.h"
#include "device/sim_device.h"

namespace py = pybind11;

namespace c10d_smddp {

namespace {

std::shared_ptr<smddp::Device> current() {
  configureSimOnce();
  return smddp::sim::deviceAt(smddp::sim::currentDevice());
}

// Errors of the stand-in reach Python as RuntimeError with their text.
template <typename F>
auto translated(F f) {
  try {
    return f();
  } catch (const smddp::Error& e) {
    throw std::runtime_error(e.what());
  }
}

struct SimEvent {
  smddp::DeviceEventPtr event;
};

}  // namespace

void bindSimTesting(py::module_& m) {
  m.def("sim_set_device", [](int index) {
    TORCH_CHECK_VALUE(index >= 0 && index < 1024, "sim_set_device: no simulated device ", index);
    smddp::sim::setDevice(index);
  });
  m.def("sim_current_device", &smddp::sim::currentDevice);
  m.def("sim_enable_torch_device", &enableSimTorchDevice);
  m.def(
      "sim_synchronize",
      [](double timeoutSeconds) {
        translated([&] {
          smddp::sim::synchronize(*current(), std::chrono::milliseconds(
                                                  static_cast<int64_t>(timeoutSeconds * 1000)));
          return 0;
        });
      },
      py::arg("timeout") = 60.0, py::call_guard<py::gil_scoped_release>());
  m.def("sim_fill_", [](const at::Tensor& t, const std::vector<uint8_t>& pattern) {
    TORCH_CHECK_VALUE(t.is_cpu() && t.is_contiguous(), "sim_fill_ takes a contiguous CPU tensor");
    translated([&] {
      auto dev = current();
      smddp::sim::fill(smddp::sim::currentStream(*dev), t.data_ptr(),
                       static_cast<size_t>(t.numel()) * t.element_size(), pattern);
      return 0;
    });
  });
  py::class_<SimEvent>(m, "SimEvent").def("query", [](SimEvent& e) {
    return translated([&] { return e.event->query(); });
  });
  m.def("sim_record", [] {
    return translated([] {
      auto dev = current();
      return SimEvent{smddp::sim::currentStream(*dev).record()};
    });
  });
  m.def("sim_begin_capture", [] { translated([] { smddp::sim::beginCapture(*current()); return 0; }); });
  m.def("sim_end_capture", [] { translated([] { smddp::sim::endCapture(*current()); return 0; }); });
  m.def("sim_contexts", &smddp::sim::contexts);
  m.def("sim_violations", &smddp::sim::violations);
  m.def("sim_clear_violations", &smddp::sim::clearViolations);
  m.def("sim_copies_from", [](const at::Tensor& t) {
    return smddp::sim::copiesFrom(t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size());
  });
}

}  // namespace c10d_smddp
