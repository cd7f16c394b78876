// The CPU-only build: no CUDA path (csrc/cuda/ is built with SMDDP_WITH_CUDA).
#include <c10/util/Exception.h>

#include "backend/device_context.h"

namespace c10d_smddp {

bool builtWithCuda() { return false; }

std::unique_ptr<DeviceContext> makeCudaContext(c10::DeviceIndex index) {
  TORCH_CHECK_VALUE(false, "this build of torch_smddp has no CUDA support: build it with "
                    "SMDDP_WITH_CUDA=ON against a CUDA build of torch (README, \"GPU path\")");
}

}  // namespace c10d_smddp
