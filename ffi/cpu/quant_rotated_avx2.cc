// The AVX2 kernel's rows of the rotated block quantizers (cpu/quant_rotated_teams.h; q4:h's
// blocks: cpu/quant_rotated_avx2_q4.h), a translation unit of its own.
#include "cpu/quant_rotated_avx2_q4.h"

#if defined(__x86_64__)
namespace jaxhc {
namespace quant {

JAXHC_ROT_KERNEL(rotated_avx2, Avx2Q4Blocks)

}  // namespace quant
}  // namespace jaxhc
#endif  // __x86_64__
