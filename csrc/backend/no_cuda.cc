// The CPU build's side of device_context.h (SMDDP_WITH_CUDA=OFF): there is
// no CUDA path, and asking for one says how to get it.
#include <c10/util/Exception.h>

#include "backend/device_context.h"
#include "backend/intra.h"

namespace c10d_smddp {

std::shared_ptr<DeviceContext> makeCudaContext(c10::DeviceIndex index) {
  TORCH_CHECK(false, "smddp: cuda:", static_cast<int>(index),
              " tensors need the GPU path, but this build of torch_smddp has no CUDA support. "
              "Rebuild it with SMDDP_WITH_CUDA=ON against a CUDA build of torch "
              "(`make check-cuda` builds one into build-cuda; see docs/gpu.md).");
}

bool builtWithCuda() { return false; }

int cudaDeviceCount() { return 0; }

c10::DeviceIndex currentCudaDevice() { return 0; }

std::shared_ptr<smddp::NcclApi> cudaNcclApi() {
  TORCH_CHECK(false, "smddp: intra-host NCCL needs a build of torch_smddp with CUDA (docs/gpu.md)");
}

}  // namespace c10d_smddp
