// allocate_tensor: CPU tensors in the process's shared pool
// (hostpath/shared_pool.h), which the ranks of a host read from each other
// with memcpy. FSDP2 takes its all-gather and reduce-scatter buffers from
// here after model.set_allocate_memory_from_process_group_for_comm(True),
// as it takes them from ncclMemAlloc under NCCL.
#include <ATen/ATen.h>

#include "backend/process_group.h"
#include "hostpath/shared_pool.h"

namespace c10d_smddp {

bool ProcessGroupSmddp::supportsTensorAlloc(c10::DeviceIndex deviceIdx) {
  // torch passes the device's index only: the CPU's is -1. A device group
  // (CUDA, index 0 and up) has no such pool.
  return deviceIdx < 0 && smddp::SharedPool::process().failure().empty();
}

at::Tensor ProcessGroupSmddp::allocateTensor(long size, at::TensorOptions options) {
  TORCH_CHECK_VALUE(size >= 0, "smddp allocate_tensor: size must be >= 0, got ", size);
  if (!options.device().is_cpu() || options.layout() != at::kStrided) {
    return at::empty({size}, options);
  }
  const size_t bytes = static_cast<size_t>(size) * c10::elementSize(options.dtype().toScalarType());
  void* p = smddp::SharedPool::process().allocate(bytes);
  if (!p) return at::empty({size}, options);  // no pool, or it is full: private memory
  return at::from_blob(
      p, {size}, [](void* q) { smddp::SharedPool::process().release(q); },
      options.pinned_memory(false));
}

}  // namespace c10d_smddp
