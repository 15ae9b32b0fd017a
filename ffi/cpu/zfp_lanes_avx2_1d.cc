// The AVX2 lane loops of 1-D rows (cpu/zfp_loops.h), a translation unit of their own.
#include "cpu/zfp_loops.h"

#if defined(__x86_64__)
namespace jaxhc {
namespace zfp {

Loops avx2_lanes_1d(Elem type, int maxbits) {
  return by_coded_type(type, [&](auto e) {
    return lane_loops<Avx2, decltype(e)::value>(maxbits);
  });
}

}  // namespace zfp
}  // namespace jaxhc
#endif  // __x86_64__
