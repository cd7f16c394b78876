// allocate_tensor: CPU tensors in the process's shared pool
// (hostpath/shared_pool.h), which the ranks of a host read from each other
// with memcpy. FSDP2 takes its all-gather and reduce-scatter buffers from
// here after model.set_allocate_memory_from_process_group_for_comm(True),
// as it takes them from ncclMemAlloc under NCCL.
#include <ATen/ATen.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "backend/call_support.h"
#include "backend/process_group.h"
#include "hostpath/shared_pool.h"

namespace c10d_smddp {

namespace {

// Whether torch's CPU allocator asks for huge pages (THP_MEM_ALLOC_ENABLE=1:
// c10's alloc_cpu madvises MADV_HUGEPAGE on allocations of 2 MiB and up)
// and the kernel may give them (transparent_hugepage/enabled not "never").
bool torchAllocatesHugePages() {
  const char* env = std::getenv("THP_MEM_ALLOC_ENABLE");
  if (!env || std::string(env) != "1") return false;  // torch takes 0 or 1
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  const std::string mode((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return !mode.empty() && mode.find("[never]") == std::string::npos;
}

}  // namespace

bool onHugePages(const at::Tensor& t) {
  static const bool enabled = torchAllocatesHugePages();
  if (!enabled || !t.device().is_cpu() || !t.has_storage()) return false;
  // Only torch's own allocations of 2 MiB and up: a tensor from from_blob
  // (numpy's, the shared pool's) or another allocator may lie anywhere.
  const c10::Storage& st = t.storage();
  return st.nbytes() >= (size_t{2} << 20) && st.allocator() == c10::GetAllocator(c10::DeviceType::CPU);
}

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
