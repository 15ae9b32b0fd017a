// The AVX2 lane loops of 1-D float32 rows (cpu/zfp_loops.h), a translation unit of their own.
#include "cpu/zfp_loops.h"

#if defined(__x86_64__)
namespace jaxhc {
namespace zfp {

Loops avx2_lanes_1d_f32(int maxbits) { return lane_loops<Avx2, Elem::kF32>(maxbits); }

}  // namespace zfp
}  // namespace jaxhc
#endif  // __x86_64__
