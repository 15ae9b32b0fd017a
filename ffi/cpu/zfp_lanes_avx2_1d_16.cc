// The AVX2 lane loops of 1-D bfloat16 and float16 rows (cpu/zfp_loops.h), a translation unit of
// their own.
#include "cpu/zfp_loops.h"

#if defined(__x86_64__)
namespace jaxhc {
namespace zfp {

Loops avx2_lanes_1d_16(Elem type, int maxbits) {
  if (type == Elem::kBF16) return lane_loops<Avx2, Elem::kBF16>(maxbits);
  return lane_loops<Avx2, Elem::kF16>(maxbits);
}

}  // namespace zfp
}  // namespace jaxhc
#endif  // __x86_64__
