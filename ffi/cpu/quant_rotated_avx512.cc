// The AVX-512 kernel's rows of the rotated block quantizers (cpu/quant_rotated_teams.h), a
// translation unit of its own.
#include "cpu/quant_rotated_teams.h"

#if defined(__x86_64__)
namespace jaxhc {
namespace quant {

JAXHC_ROT_KERNEL(rotated_avx512, Avx512Blocks)

}  // namespace quant
}  // namespace jaxhc
#endif  // __x86_64__
