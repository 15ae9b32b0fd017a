// Block-quantization kernels on host memory (the format of core/quant.h): what the CPU FFI
// handlers run. Row r of x starts at x + r * n values, its payload at payload + r *
// payload_bytes(n, bits, block) (8-byte aligned); bits is 8 or 4 and block valid_block.
#pragma once
#include <cstdint>

#include "core/quant.h"

namespace jaxhc {
namespace quant {

enum class Elem { kF32, kBF16, kF16 };

// AVX2 + F16C vectors, or portable scalar code (the same bytes). JAXHC_QUANT_KERNEL=avx2|portable
// forces one (the tests run both); unset or "auto" takes AVX2 where the CPU has it.
enum class Kernel { kPortable, kAvx2 };
const char* kernel_name(Kernel k);
bool kernel_supported(Kernel k);
// Throws std::invalid_argument (one line naming the value) for a name this CPU cannot run.
Kernel active_kernel();

// ok gets one flag per row: every value finite. rnd: round to nearest even, or stochastically.
void encode_rows(Kernel k, const void* x, Elem type, uint64_t rows, uint64_t n, int bits,
                 uint64_t block, Rounding rnd, uint8_t* payload, bool* ok);
// `parts` consecutive payloads per row, decoded to `type` and added in order 0..parts-1 in
// float32 (the calling thread's floating-point mode), then rounded to `type`; parts = 1: decode.
void decode_sum_rows(Kernel k, const uint8_t* payload, int parts, Elem type, uint64_t rows,
                     uint64_t n, int bits, uint64_t block, void* x);

}  // namespace quant
}  // namespace jaxhc
