// Rotated block quantization (q8:h, q4:h), host and device code: the one definition of the format,
// its arithmetic and the fast Walsh-Hadamard transform, used by the CPU kernels
// (cpu/quant_rotated_teams.h: a one-value "team", an AVX2 and an AVX-512 one, each instantiated in
// a unit of its own) and the CUDA kernels (cuda/quant_cuda.cu: a warp).
//
// Format. A row of n values is cut into blocks of B = 2^b values (64..1024); the last block is
// padded with zeros to B. Payload: [scales: float32 x blocks][codes: B per block, in value order;
// 8 bits: a byte each, 4 bits: value 2j in the low nibble of byte j][zeros up to a multiple of 8
// bytes]. With K = 2^(bits - 1), code K + k stands for level L_k and code K - 1 - k for -L_k
// (k < K; L_k = kLevels<bits>[k] / 2^16, core/quant_levels.h: the Lloyd-Max levels of N(0, 1)).
//
// The transform works on integers, so it is exact: no rounding, no order of operations to keep,
// nothing a flush-to-zero mode could change. Encode, one block (x widened to float32 exactly):
//  1. a = the largest |x| (on the bits). NaN, Inf or a >= 2^116: the row is not ok (the collectives
//     send it raw) and the block a zero block (scale 0, codes 0); a < 2^-96: a zero block (ok).
//  2. x as integers: with E = a's exponent (2^E <= a < 2^(E+1)), q_i = round_half_even(x_i *
//     2^(19 - E)) (|q_i| <= 2^20), negated where negated(i) (a fixed hash of the value's position
//     in its block: the same signs on every rank). q = 2^(19 - E) D x.
//  3. y = H q, H the Sylvester-Hadamard matrix of order B (int32: |y| <= 2^30).
//  4. sigma = sqrt(sum of q_i^2) in float64 (the sum is exact: below 2^51): the RMS of y, as
//     sum(y^2) = B sum(q^2). Thresholds T_j = floor(t_j * sigma) (t: kThresholds<bits>, float64
//     products); code K + k, k = how many T_j lie below |y_i| (K - 1 - k where y_i < 0).
//  5. Scale s = float32(sigma * 2^-(b + 19 - E + 16)), in [2^-122, 2^98).
// Decode, one block: a scale outside [2^-123, 2^98) (0, negative, NaN: any bytes may arrive)
// decodes to zeros; else v = H (kLevels of the codes, signed) in int32 (|v| < 2^29), and x_i =
// float32(v_i) * s (float32 product), negated where negated(i), rounded to the output type: 0 or
// at least 2^-123 in magnitude and below 2^127, so never subnormal and always finite. H H = B I,
// so x = D H (sigma L) / (B 2^(19 - E)) undoes steps 2-4 but for the rounding in step 2 (2^-20 of
// the block's largest value) and the quantization of y to sigma times the levels.
#pragma once
#include <cmath>

#include "core/quant.h"
#include "core/quant_levels.h"

// Loops over the rows of a block, unrolled: constant trip counts, so the rows stay in registers.
// (eight at a time on the host: the portable kernel's rows are single values).
#if defined(__CUDACC__)
#define JAXHC_ROT_UNROLL _Pragma("unroll")
#elif defined(__clang__)
#define JAXHC_ROT_UNROLL _Pragma("unroll 8")
#elif defined(__GNUC__)
#define JAXHC_ROT_UNROLL _Pragma("GCC unroll 8")
#else
#define JAXHC_ROT_UNROLL
#endif

namespace jaxhc {
namespace quant {

constexpr int kMinLog2Block = 6, kMaxLog2Block = 10;
constexpr int kFixedBits = 19;  // q = x * 2^(19 - E): 20-bit integers
constexpr int kLevelBits = 16;  // levels in units of 2^-16
constexpr uint32_t kTinyRotBits = (127u - 96) << 23;   // a < 2^-96: a zero block
constexpr uint32_t kHugeBits = (127u + 116) << 23;     // a >= 2^116 (or NaN/Inf): not ok
constexpr uint32_t kMinScaleBits = (127u - 123) << 23;  // scales a decoder takes: [2^-123, 2^98)
constexpr uint32_t kMaxScaleBits = (127u + 98) << 23;
constexpr uint32_t kSignSeed = 0x9e3779b9u;
constexpr int32_t kNoThreshold = 0x7fffffff;  // pads the thresholds to K

JAXHC_HD bool valid_rotated_block(int64_t block) {
  return block >= (1 << kMinLog2Block) && block <= (1 << kMaxLog2Block) &&
         (block & (block - 1)) == 0;
}
JAXHC_HD constexpr int log2_of(uint64_t block) {
  int b = 0;
  while ((uint64_t{1} << b) < block) b++;
  return b;
}
// The plain layout's size for the whole blocks: every code of a padded block is sent.
JAXHC_HD uint64_t rotated_payload_bytes(uint64_t n, int bits, uint64_t block) {
  return payload_bytes(blocks_of(n, block) * block, bits, block);
}
// Bytes of a q8/q4 payload, rotated (q8:h, q4:h) or not.
JAXHC_HD uint64_t payload_bytes(uint64_t n, int bits, uint64_t block, bool rotate) {
  return rotate ? rotated_payload_bytes(n, bits, block) : payload_bytes(n, bits, block);
}

// Whether the value at position i of a block changes sign on the way in (and back out).
JAXHC_HD constexpr bool negated(uint32_t i) { return (mix32(i ^ kSignSeed) >> 31) != 0; }

JAXHC_HD float flip(float v, bool neg) { return float_of(bits_of(v) ^ (neg ? 0x80000000u : 0u)); }

// Step 2: 2^(19 - E) for a block whose largest |x| has bits `amax` (kTinyRotBits..kHugeBits).
JAXHC_HD float fixed_factor(uint32_t amax) {
  return float_of((127u + kFixedBits + 127u - (amax >> 23)) << 23);
}
JAXHC_HD int32_t to_fixed(float x, float factor, bool neg) {
  const int32_t q = round_even(mul_rn(x, factor));
  return neg ? -q : q;
}

JAXHC_HD double sqrt_rn(double v) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(v);
#else
  return std::sqrt(v);
#endif
}

// Step 4's thresholds: T_j = floor(t_j * sigma) for j < K - 1, T_(K-1) = kNoThreshold.
JAXHC_HD int32_t fixed_threshold(const float* t, int j, int bits, double sigma) {
  if (j + 1 == 1 << (bits - 1)) return kNoThreshold;
#if defined(__CUDA_ARCH__)
  return static_cast<int32_t>(floor(__dmul_rn(double(t[j]), sigma)));
#else
  return static_cast<int32_t>(std::floor(double(t[j]) * sigma));
#endif
}
JAXHC_HD void fixed_thresholds(const float* t, int bits, double sigma, int32_t* thr) {
  for (int j = 0; j < 1 << (bits - 1); ++j) thr[j] = fixed_threshold(t, j, bits, sigma);
}

// Step 5: sigma * 2^-(b + 19 - E + 16), rounded to float32.
JAXHC_HD float block_scale(double sigma, int log2_block, uint32_t amax) {
  const int e = log2_block + kFixedBits + kLevelBits - (static_cast<int>(amax >> 23) - 127);
  const uint64_t pb = static_cast<uint64_t>(1023 - e) << 52;
  double p;
  memcpy(&p, &pb, sizeof p);
#if defined(__CUDA_ARCH__)
  return __double2float_rn(__dmul_rn(sigma, p));
#else
  return static_cast<float>(sigma * p);
#endif
}

// The code of y (a binary search for how many of thr lie below |y|).
JAXHC_HD int code_of(int32_t y, const int32_t* thr, int bits) {
  const int half = 1 << (bits - 1);
  const int32_t a = y < 0 ? -y : y;
  int k = 0;
  for (int step = half / 2; step; step >>= 1)
    if (a > thr[k + step - 1]) k += step;
  return y < 0 ? half - 1 - k : half + k;
}

// The signed level of a code in units of 2^-16 (`levels`: kLevels<bits>).
JAXHC_HD int32_t level_of(int code, const int32_t* levels, int bits) {
  const int half = 1 << (bits - 1);
  return code >= half ? levels[code - half] : -levels[half - 1 - code];
}

JAXHC_HD bool valid_scale(float s) {
  const uint32_t b = bits_of(s);
  return b >= kMinScaleBits && b < kMaxScaleBits;
}

// The decoded value from v = (H levels)_i, the block's scale and the position's sign.
JAXHC_HD float decoded(int32_t v, float scale, bool neg) {
#if defined(__CUDA_ARCH__)
  const float f = __int2float_rn(v);
#else
  const float f = static_cast<float>(v);  // to nearest (|v| >= 2^24 rounds)
#endif
  return flip(mul_rn(f, scale), neg);
}

// --- the transform and the sum of squares, for any team ------------------------------------------
// A team holds one block as R rows of kLanes int32 values (value r * kLanes + j in lane j of row
// r): V, a row; kGroup, the rows it transforms at once (in registers); add(a, b), sub(a, b) lane
// by lane; lane_butterfly(v, h) (h < kLanes): lane j gets v_j + v_(j+h) where bit h of j is
// clear, v_(j-h) - v_j where it is set; D, kLanes float64 sums: dzero(), square_add(d, v),
// dadd(d, e), lane_total(d). Integer sums are exact, so any order of the stages gives H v.

// The row stages h = 1, 2, ..., count / 2 of the rows a[0..count) (count a power of two).
template <class Tm>
JAXHC_HD void row_stages(typename Tm::V* a, int count) {
  JAXHC_ROT_UNROLL
  for (int h = 1; h < count; h *= 2)
    JAXHC_ROT_UNROLL
    for (int r0 = 0; r0 < count; r0 += 2 * h)
      JAXHC_ROT_UNROLL
      for (int r = r0; r < r0 + h; ++r) {
        const typename Tm::V lo = a[r], hi = a[r + h];
        a[r] = Tm::add(lo, hi);
        a[r + h] = Tm::sub(lo, hi);
      }
}

// Step 3 on R rows: v = H v in place, a group of kGroup rows at a time (the lane stages and the
// row stages inside the group), then radix-kGroup passes for the larger row strides.
template <class Tm, int R>
JAXHC_HD void fwht(typename Tm::V* v) {
  using V = typename Tm::V;
  constexpr int G = R < Tm::kGroup ? R : Tm::kGroup;
  JAXHC_ROT_UNROLL
  for (int g = 0; g < R; g += G) {
    V a[G];
    JAXHC_ROT_UNROLL
    for (int k = 0; k < G; ++k) a[k] = v[g + k];
    JAXHC_ROT_UNROLL
    for (int h = 1; h < Tm::kLanes; h *= 2)
      JAXHC_ROT_UNROLL
      for (int k = 0; k < G; ++k) a[k] = Tm::lane_butterfly(a[k], h);
    row_stages<Tm>(a, G);
    JAXHC_ROT_UNROLL
    for (int k = 0; k < G; ++k) v[g + k] = a[k];
  }
  JAXHC_ROT_UNROLL
  for (int h = G; h < R; h *= G) {
    const int count = R / h < G ? R / h : G;  // rows r, r + h, ... of one butterfly set
    JAXHC_ROT_UNROLL
    for (int r0 = 0; r0 < R; r0 += h * count)
      JAXHC_ROT_UNROLL
      for (int off = 0; off < h; ++off) {
        V a[G];
        JAXHC_ROT_UNROLL
        for (int k = 0; k < count; ++k) a[k] = v[r0 + off + k * h];
        row_stages<Tm>(a, count);
        JAXHC_ROT_UNROLL
        for (int k = 0; k < count; ++k) v[r0 + off + k * h] = a[k];
      }
  }
}

// Step 4's sum of q_i^2 over R rows, exact (each square below 2^41, the sum below 2^51).
template <class Tm, int R>
JAXHC_HD double sum_squares(const typename Tm::V* v) {
  static_assert(R % 2 == 0, "blocks of at least 64 values");
  typename Tm::D a0 = Tm::dzero(), a1 = Tm::dzero();
  JAXHC_ROT_UNROLL
  for (int r = 0; r < R; r += 2) {
    a0 = Tm::square_add(a0, v[r]);
    a1 = Tm::square_add(a1, v[r + 1]);
  }
  return Tm::lane_total(Tm::dadd(a0, a1));
}

// The one-value team: the reference (CPU portable kernel).
struct ScalarTeam {
  using V = int32_t;
  using D = double;
  static constexpr int kLanes = 1, kGroup = 8;
  static JAXHC_HD V add(V a, V b) { return a + b; }
  static JAXHC_HD V sub(V a, V b) { return a - b; }
  static JAXHC_HD V lane_butterfly(V v, int) { return v; }  // never called: one lane
  static JAXHC_HD D dzero() { return 0.0; }
  static JAXHC_HD D square_add(D d, V v) { return d + double(v) * double(v); }
  static JAXHC_HD D dadd(D a, D b) { return a + b; }
  static JAXHC_HD double lane_total(D d) { return d; }
};

template <int N>
struct IntTag {
  static constexpr int value = N;
};

// Calls fn(IntTag<B>{}) for a valid rotated block size B.
template <typename Fn>
JAXHC_HD void with_block(uint64_t block, Fn&& fn) {
  switch (block) {
    case 64: return fn(IntTag<64>{});
    case 128: return fn(IntTag<128>{});
    case 256: return fn(IntTag<256>{});
    case 512: return fn(IntTag<512>{});
    default: return fn(IntTag<1024>{});
  }
}

}  // namespace quant
}  // namespace jaxhc
