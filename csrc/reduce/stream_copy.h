// Copies for the fusion buffer's way out. Results go back to the callers'
// tensors once and are not read again by the engine, so large batches are
// written with non-temporal stores: no read-for-ownership of the
// destination, and the segment's slots stay in cache.
#pragma once

#include <cstddef>

namespace smddp {

// memcpy with streaming (cache-bypassing) stores where the CPU has them.
void copyStreaming(void* dst, const void* src, size_t bytes);
// copyStreaming when `streaming`, else memcpy (the caller fences).
void copyMaybeStreaming(void* dst, const void* src, size_t bytes, bool streaming);
// Orders earlier streaming stores before later ordinary ones.
void streamingFence();

}  // namespace smddp
