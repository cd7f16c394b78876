#include "device/cuda/host_wait_kernel.h"

namespace smddp {

namespace {

// One thread polls the word: the read must go to host memory every time
// (volatile), and the sleep between reads keeps the poll off the bus.
__global__ void waitForHostWord(const volatile uint64_t* word, uint64_t value) {
  while (*word < value) __nanosleep(1000);
}

}  // namespace

cudaError_t launchHostWaitKernel(cudaStream_t stream, const uint64_t* word, uint64_t value) {
  waitForHostWord<<<1, 1, 0, stream>>>(word, value);
  return cudaGetLastError();
}

}  // namespace smddp
