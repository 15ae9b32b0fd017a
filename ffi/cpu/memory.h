// Host memory hints for the CPU handlers.
#pragma once
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>

namespace jaxhc {

// Asks for transparent huge pages on the 2 MiB-aligned inside of a large output buffer: XLA hands
// out fresh buffers, and faulting them in 4 KiB at a time costs as much as decoding into them.
inline void prefer_huge_pages(void* data, size_t bytes) {
#if defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  if (bytes < 4 * kHuge) return;
  uintptr_t b = (reinterpret_cast<uintptr_t>(data) + kHuge - 1) & ~(kHuge - 1);
  uintptr_t e = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kHuge - 1);
  if (e > b) madvise(reinterpret_cast<void*>(b), e - b, MADV_HUGEPAGE);
#else
  (void)data, (void)bytes;
#endif
}

}  // namespace jaxhc
