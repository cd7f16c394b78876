// The running call's memory (call_memory.h).
#include "engine/call_memory.h"

#include <sys/mman.h>

#include "common/error.h"

namespace smddp {

uint8_t* CallMemory::scratch(size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

uint8_t* CallMemory::fusionBuffer(size_t bytes) {
  if (fusion_.size() < bytes) fusion_.resize(bytes);
  return fusion_.data();
}

void CallMemory::holdForSend(Request* r) {
  if (!callHeld_) callHeld_ = std::make_shared<HeldMemory>();
  r->held = callHeld_;
  traffic_.sendHeld();
}

std::shared_ptr<HeldMemory> CallMemory::detachHeldMemory() {
  if (!callHeld_) return nullptr;
  callHeld_->scratch.swap(scratch_);
  callHeld_->fusion.swap(fusion_);
  return std::move(callHeld_);  // the sends hold it now
}

void CallMemory::Sink::reserve() {
  void* p = mmap(nullptr, kSinkBytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  SMDDP_CHECK(p != MAP_FAILED, kInternal, "cannot reserve the overflow sink");
  base = p;
}

void CallMemory::Sink::release() {
  if (base) munmap(base, kSinkBytes);
  base = nullptr;
}

}  // namespace smddp
