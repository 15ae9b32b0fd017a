// The AVX2 lane loops of 2-D and 3-D rows (cpu/zfp_loops.h), a translation unit of their own.
#include "cpu/zfp_loops.h"

#if defined(__x86_64__)
namespace jaxhc {
namespace zfp {

Loops avx2_lanes_nd(Elem type, int dims) {
  return by_coded_type(type, [&](auto e) {
    constexpr Elem E = decltype(e)::value;
    return dims == 2 ? NdLanesAvx2<2, E>::loops() : NdLanesAvx2<3, E>::loops();
  });
}

}  // namespace zfp
}  // namespace jaxhc
#endif  // __x86_64__
