// ZFP fixed-rate kernels on host memory: what the CPU FFI handlers run, callable from other host
// code too (e.g. a fused MPI collective). A row is n values coded in blocks of 4^dims (dims 1, 2
// or 3: core/zfp.h, core/zfp_nd.h); its stream is payload_bytes(n, maxbits, dims) bytes of 64-bit
// words, 8-byte aligned, byte-identical to zfpy.compress_numpy(x, rate, write_header=False) of
// the row (1-D) or of its (ceil(n / 4), 4) or (ceil(n / 16), 4, 4) layout. bfloat16/float16 rows
// code their values widened to float32 (the float32 row's stream); decoding into them rounds as
// jnp.astype does. maxbits must be valid_maxbits for the coded type (float32, or float64 for
// kF64) and dims. The lane-parallel kernels code 1-D rows (core/zfp_lanes.h) and 2-D/3-D rows
// (core/zfp_nd_lanes.h, one plane code per block) of float32 coded values; float64 2-D/3-D rows
// take the scalar block coder (compiled for AVX2 under the avx2 and avx512 kernels).
#pragma once
#include <cstdint>

namespace jaxhc {
namespace zfp {

enum class Elem { kF32, kF64, kBF16, kF16 };

// The block coder: lane-parallel (AVX-512 with VBMI, VBMI2 and GFNI: 16 blocks at a time; AVX2:
// 8), or one block at a time with BMI2 bit permutations, or portable. Float64 rows take the
// fastest scalar one. JAXHC_ZFP_KERNEL=avx512|avx2|bmi2|portable forces one (the tests run each
// against zfpy); unset or "auto" takes the fastest this CPU has.
enum class Kernel { kPortable, kBmi2, kAvx2, kAvx512 };
const char* kernel_name(Kernel k);
bool kernel_supported(Kernel k);
// The kernel JAXHC_ZFP_KERNEL selects; throws std::invalid_argument (one line naming the value)
// for an unknown name or one this CPU cannot run.
Kernel active_kernel();

// Whole rows, on the host's threads (jaxhc::parallel_for), with active_kernel().
// encode_row returns whether all n values are finite (zfp's lossy modes promise nothing else).
bool encode_row(const void* x, Elem type, uint64_t n, int maxbits, int dims, uint64_t* payload);
void decode_row(const uint64_t* payload, Elem type, uint64_t n, int maxbits, int dims, void* x);
// x[i] = the sum over p = 0, 1, ..., parts - 1 (in that order) of value i of payloads[p], each
// first rounded to `type`, accumulated in float32 (float64 for kF64) with the calling thread's
// floating-point mode (XLA:CPU flushes denormals), then rounded to `type`: what decoding every
// payload and adding the rows in rank order gives, without the decoded rows in memory.
void decode_sum(const uint64_t* const* payloads, int parts, Elem type, uint64_t n, int maxbits, int dims,
                void* x);

// The same for blocks [b0, b1) of a row (values [S b0, min(n, S b1)), S = 4^dims) on the calling thread
// only, for callers that pipeline a row in segments. b0 * maxbits must be a multiple of 64 (the
// blocks start a stream word); x, payload and payloads point at the start of their rows.
bool encode_blocks(Kernel k, const void* x, Elem type, uint64_t n, int maxbits, int dims, uint64_t b0,
                   uint64_t b1, uint64_t* payload);
void decode_blocks(Kernel k, const uint64_t* payload, Elem type, uint64_t n, int maxbits, int dims,
                   uint64_t b0, uint64_t b1, void* x);
void decode_sum_blocks(Kernel k, const uint64_t* const* payloads, int parts, Elem type, uint64_t n,
                       int maxbits, int dims, uint64_t b0, uint64_t b1, void* x);

// Several rows at once, as the FFI handlers get them: row r of x at x + r * n values, its
// payload at payload + r * payload_bytes(n, maxbits, dims) / 8; `finite` gets one flag per row.
// decode_sum_rows takes `parts` consecutive payloads per row.
void encode_rows(Kernel k, const void* x, Elem type, uint64_t rows, uint64_t n, int maxbits, int dims,
                 uint64_t* payload, bool* finite);
void decode_rows(Kernel k, const uint64_t* payload, Elem type, uint64_t rows, uint64_t n,
                 int maxbits, int dims, void* x);
void decode_sum_rows(Kernel k, const uint64_t* payload, int parts, Elem type, uint64_t rows,
                     uint64_t n, int maxbits, int dims, void* x);

}  // namespace zfp
}  // namespace jaxhc
