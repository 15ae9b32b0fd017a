// The rotated block quantizers' rows (quant_kernels.h) on the kernel asked for, and the portable
// kernel's rows; the AVX2 and AVX-512 kernels' rows are compiled in quant_rotated_avx2.cc and
// quant_rotated_avx512.cc (cpu/quant_rotated_teams.h).
#include "cpu/quant_rotated_teams.h"

namespace jaxhc {
namespace quant {

JAXHC_ROT_KERNEL(rotated_portable, ScalarBlocks)

namespace {

RotatedRows rotated(Kernel k) {
#if defined(__x86_64__)
  if (k == Kernel::kAvx512) return rotated_avx512();
  if (k == Kernel::kAvx2) return rotated_avx2();
#endif
  (void)k;
  return rotated_portable();
}

}  // namespace

void encode_rotated_rows(Kernel k, const void* x, Elem type, uint64_t rows, uint64_t n, int bits,
                         uint64_t block, uint8_t* payload, bool* ok) {
  rotated(k).encode(x, type, rows, n, bits, block, payload, ok);
}

void decode_sum_rotated_rows(Kernel k, const uint8_t* payload, int parts, Elem type,
                             uint64_t rows, uint64_t n, int bits, uint64_t block, void* x) {
  rotated(k).decode_sum(payload, parts, type, rows, n, bits, block, x);
}

void hadamard_rows(Kernel k, const int32_t* x, uint64_t n, uint64_t block, int32_t* y) {
  rotated(k).hadamard(x, n, block, y);
}

}  // namespace quant
}  // namespace jaxhc
