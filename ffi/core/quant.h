// Block quantization (q8, q4), host and device code: the one definition of the format and its
// rounding, used by the CPU kernels (cpu/quant_cpu.cc, which vectorizes the same arithmetic) and
// the CUDA kernels (cuda/quant_cuda.cu).
//
// A row of n values is cut into blocks of `block` values (the last one may be shorter). Each
// block stores its scale s = absmax / Q as a float32 (Q = 127 for 8 bits, 7 for 4 bits) and one
// signed `bits`-bit code per value, q = round_half_even(x * (Q / absmax)); a value decodes to
// q * s. So |x - decoded| <= s / 2 plus float32 rounding (a few ulps of absmax).
//
// Payload: [scales: float32 x blocks][codes: ceil(n * bits / 8) bytes][zeros up to a multiple
// of 8 bytes]. 8-bit codes are int8; 4-bit codes are two's-complement nibbles, value 2j in the
// low nibble of byte j and value 2j + 1 in the high one.
//
// Arithmetic a flush-to-zero mode cannot change: absmax is taken on the bits (|x| as an integer
// orders like the float), and a block whose absmax is below 2^-100 (or not finite) is a zero
// block (scale 0, codes 0), so the scale, its inverse and every decoded value are normal floats
// or zero, and a product x * inv that would be subnormal rounds to code 0 either way.
// bfloat16/float16 rows are coded as their exact float32 widening; decoded values are rounded to
// them as jnp.astype does (core/floats.h). Each product is a single rounded multiply (no FMA).
//
// Stochastic rounding (Rounding::stochastic, seeded): y = x * inv rounds up to floor(y) + 1 with
// probability frac(y) = y - floor(y) (to 2^-24), else down, so the decoded value is unbiased over
// seeds. The uniform draw is r / 2^24 with r = 24 bits of a hash of (seed, the value's index in
// its row, the value's float32 bits): reproducible, the same on CPU and GPU, different for each
// value and each input. A subnormal x or |y| < 2^-24 gives code 0 (so a flush of subnormals to
// zero changes nothing), and codes are clamped to [-Q, Q]. The payload format and decoding do not change.
#pragma once
#include <cmath>

#include "core/common.h"
#include "core/floats.h"

namespace jaxhc {
namespace quant {

constexpr uint32_t kTinyBits = 27u << 23;   // 2^-100: smaller blocks code as zeros
constexpr uint32_t kInfBits = 0x7f800000u;  // abs bits at or above: Inf or NaN
constexpr int64_t kMaxBlock = int64_t{1} << 20;

JAXHC_HD bool valid_bits(int64_t bits) { return bits == 8 || bits == 4; }
JAXHC_HD bool valid_block(int64_t block) {
  return block >= 8 && block <= kMaxBlock && block % 8 == 0;
}
JAXHC_HD int qmax(int bits) { return (1 << (bits - 1)) - 1; }
JAXHC_HD uint64_t blocks_of(uint64_t n, uint64_t block) { return (n + block - 1) / block; }
JAXHC_HD uint64_t code_bytes(uint64_t n, int bits) { return (n * bits + 7) / 8; }
JAXHC_HD uint64_t payload_bytes(uint64_t n, int bits, uint64_t block) {
  return (4 * blocks_of(n, block) + code_bytes(n, bits) + 7) / 8 * 8;
}

// |v| as bits: for non-NaN floats, integer order is float order.
JAXHC_HD uint32_t abs_bits(float v) { return bits_of(v) & 0x7fffffffu; }

JAXHC_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);  // never contracted into an FMA
#else
  return a * b;  // the CPU sources are compiled with -ffp-contract=off
#endif
}

JAXHC_HD int round_even(float y) {
#if defined(__CUDA_ARCH__)
  return __float2int_rn(y);
#else
  return static_cast<int>(std::nearbyint(y));  // the default rounding mode: half to even
#endif
}

struct Scale {
  float scale;  // stored in the payload; decoded value = code * scale
  float inv;    // code = round_even(x * inv)
};

// The scale of a block from the largest abs bits of its values (zero block: tiny or not finite).
JAXHC_HD Scale scale_of(uint32_t amax_bits, int bits) {
  if (amax_bits >= kInfBits || amax_bits < kTinyBits) return {0.0f, 0.0f};
  const float amax = float_of(amax_bits), q = static_cast<float>(qmax(bits));
  return {amax / q, q / amax};
}

JAXHC_HD int quantize(float x, float inv) { return round_even(mul_rn(x, inv)); }

struct Rounding {
  bool stochastic = false;
  uint32_t seed = 0;
};

// A 32-bit integer hash with full avalanche (xor-shift / multiply rounds).
JAXHC_HD constexpr uint32_t mix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x7feb352du;
  h ^= h >> 15;
  h *= 0x846ca68bu;
  return h ^ (h >> 16);
}

// 24 uniform bits for value i (index in its row) of float32 bits xb, under a seed.
JAXHC_HD uint32_t sr_draw(uint32_t seed, uint64_t i, uint32_t xb) {
  uint32_t h = mix32(static_cast<uint32_t>(i) ^ mix32(static_cast<uint32_t>(i >> 32) ^ seed));
  return mix32(h ^ xb) >> 8;
}

JAXHC_HD float floor_f(float y) {
#if defined(__CUDA_ARCH__)
  return floorf(y);
#else
  return std::floor(y);
#endif
}

// The stochastically rounded code of x (see the header): draw = sr_draw(...), q = qmax(bits).
JAXHC_HD int quantize_sr(float x, float inv, int q, uint32_t draw) {
  const float y = mul_rn(x, inv);
  if (abs_bits(x) < (1u << 23) || abs_bits(y) < (103u << 23)) return 0;  // |y| < 2^-24
  const float f = floor_f(y), frac = y - f;
  int c = static_cast<int>(f) + (static_cast<float>(draw) < frac * 16777216.0f);
  return c > q ? q : c < -q ? -q : c;
}

JAXHC_HD float dequantize(int code, float scale) { return mul_rn(static_cast<float>(code), scale); }

// Code i of a row's code bytes.
JAXHC_HD int code_at(const uint8_t* codes, uint64_t i, int bits) {
  if (bits == 8) return static_cast<int8_t>(codes[i]);
  const int nib = (codes[i >> 1] >> ((i & 1) * 4)) & 0xf;
  return nib >= 8 ? nib - 16 : nib;
}

// The code byte holding values 2j, 2j+1 (4 bits), or value j (8 bits).
JAXHC_HD uint8_t code_byte(int lo, int hi, int bits) {
  if (bits == 8) return static_cast<uint8_t>(static_cast<int8_t>(lo));
  return static_cast<uint8_t>((lo & 0xf) | ((hi & 0xf) << 4));
}

}  // namespace quant
}  // namespace jaxhc
