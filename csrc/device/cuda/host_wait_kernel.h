// The fallback for DeviceStream::waitHost where the driver offers no
// cuStreamWaitValue64: a one-thread kernel that holds its stream until a
// word of mapped host memory reaches a value (host_wait_kernel.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace smddp {

// Queues the wait on `stream` (of the current device). `word` is the
// device pointer of mapped page-locked memory (cudaHostGetDevicePointer).
// Returns the launch's status.
cudaError_t launchHostWaitKernel(cudaStream_t stream, const uint64_t* word, uint64_t value);

}  // namespace smddp
