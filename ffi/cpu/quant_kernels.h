// Block-quantization kernels on host memory (the formats of core/quant.h and, rotated,
// core/quant_rotated.h): what the CPU FFI handlers run. Row r of x starts at x + r * n values, its
// payload at payload + r * payload_bytes(n, bits, block, rotate) (8-byte aligned); bits is 8 or 4
// and block valid_block (rotated: valid_rotated_block).
#pragma once
#include <cstdint>

#include "core/quant.h"

namespace jaxhc {
namespace quant {

enum class Elem { kF32, kBF16, kF16 };

// AVX2 + F16C vectors, or portable scalar code (the same bytes); avx512 is avx2 but for the
// rotated codecs, which it runs on AVX-512 (F, BW, DQ, VL, VBMI) vectors. JAXHC_QUANT_KERNEL=
// avx512|avx2|portable forces one (the tests run each this CPU has); unset or "auto" takes the
// first of these the CPU has.
enum class Kernel { kPortable, kAvx2, kAvx512 };
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

// The rotated codecs (q8:h, q4:h; cpu/quant_rotated.cc), as encode_rows (round to the nearest
// level only) and decode_sum_rows. ok: every value finite and below 2^116 in magnitude.
void encode_rotated_rows(Kernel k, const void* x, Elem type, uint64_t rows, uint64_t n, int bits,
                         uint64_t block, uint8_t* payload, bool* ok);
void decode_sum_rotated_rows(Kernel k, const uint8_t* payload, int parts, Elem type,
                             uint64_t rows, uint64_t n, int bits, uint64_t block, void* x);
// The transform alone: y = H x per block of int32 values (n a multiple of block), exact while
// block * max |x| < 2^31.
void hadamard_rows(Kernel k, const int32_t* x, uint64_t n, uint64_t block, int32_t* y);

}  // namespace quant
}  // namespace jaxhc
