// Rotated block quantization (q8:h, q4:h), host and device code: the one definition of the format,
// its arithmetic and the fast Walsh-Hadamard transform, used by the CPU kernels
// (cpu/quant_rotated.cc: a one-value "team" and an AVX2 one) and the CUDA kernels
// (cuda/quant_cuda.cu: a warp).
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
//     products); code K + k, k = how many T_j lie below |y_i| (K - 1 - k where y_i < 0); gain
//     g = sigma. 4 bits: the thresholds and the gain of the best of three scales instead (below:
//     "q4:h's scale choice"), g in [sigma / 2, 3 sigma / 2].
//  5. Scale s = float32(g * 2^-(b + 19 - E + 16)), in [2^-123, 2^98) (sigma's in [2^-122, 2^97]).
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
// (eight at a time on the host: the portable kernel's rows are single values). The loops over a
// group of rows held in registers (at most 16 on the host) unroll completely.
#if defined(__CUDACC__)
#define JAXHC_ROT_UNROLL _Pragma("unroll")
#define JAXHC_ROT_UNROLL_GROUP _Pragma("unroll")
#elif defined(__clang__)
#define JAXHC_ROT_UNROLL _Pragma("unroll 8")
#define JAXHC_ROT_UNROLL_GROUP _Pragma("unroll 16")
#elif defined(__GNUC__)
#define JAXHC_ROT_UNROLL _Pragma("GCC unroll 8")
#define JAXHC_ROT_UNROLL_GROUP _Pragma("GCC unroll 16")
#else
#define JAXHC_ROT_UNROLL
#define JAXHC_ROT_UNROLL_GROUP
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

// The code of a value y whose magnitude has index k (k < 2^(bits - 1)).
JAXHC_HD int signed_code(int32_t y, int k, int bits) {
  const int half = 1 << (bits - 1);
  return y < 0 ? half - 1 - k : half + k;
}

// The code of y (a binary search for how many of thr lie below |y|).
JAXHC_HD int code_of(int32_t y, const int32_t* thr, int bits) {
  const int half = 1 << (bits - 1);
  const int32_t a = y < 0 ? -y : y;
  int k = 0;
  for (int step = half / 2; step; step >>= 1)
    if (a > thr[k + step - 1]) k += step;
  return signed_code(y, k, bits);
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

// The row stages h = 1, 2, ..., kCount / 2 of the rows a[0..kCount) (a power of two). Every
// trip count is a constant, so a[] stays in registers.
template <class Tm, int kCount>
JAXHC_HD void row_stages(typename Tm::V* a) {
  JAXHC_ROT_UNROLL_GROUP
  for (int h = 1; h < kCount; h *= 2)
    JAXHC_ROT_UNROLL_GROUP
    for (int r0 = 0; r0 < kCount; r0 += 2 * h)
      JAXHC_ROT_UNROLL_GROUP
      for (int r = r0; r < r0 + h; ++r) {
        const typename Tm::V lo = a[r], hi = a[r + h];
        a[r] = Tm::add(lo, hi);
        a[r + h] = Tm::sub(lo, hi);
      }
}

// The row stages of stride kH and up to kH * kGroup on R rows: sets of rows r, r + kH, ...
// (radix min(R / kH, kGroup)) transformed in registers, then the larger strides.
template <class Tm, int R, int kH>
JAXHC_HD void strided_stages(typename Tm::V* v) {
  if constexpr (kH < R) {
    using V = typename Tm::V;
    constexpr int kCount = R / kH < Tm::kGroup ? R / kH : Tm::kGroup;
    for (int r0 = 0; r0 < R; r0 += kH * kCount)
      for (int off = 0; off < kH; ++off) {
        V a[kCount];
        JAXHC_ROT_UNROLL_GROUP
        for (int k = 0; k < kCount; ++k) a[k] = v[r0 + off + k * kH];
        row_stages<Tm, kCount>(a);
        JAXHC_ROT_UNROLL_GROUP
        for (int k = 0; k < kCount; ++k) v[r0 + off + k * kH] = a[k];
      }
    strided_stages<Tm, R, kH * kCount>(v);
  }
}

// Step 3 on R rows: v = H v in place, a group of kGroup rows at a time (the lane stages and the
// row stages inside the group), then the larger row strides (strided_stages).
template <class Tm, int R>
JAXHC_HD void fwht(typename Tm::V* v) {
  using V = typename Tm::V;
  constexpr int G = R < Tm::kGroup ? R : Tm::kGroup;
  for (int g = 0; g < R; g += G) {
    V a[G];
    JAXHC_ROT_UNROLL_GROUP
    for (int k = 0; k < G; ++k) a[k] = v[g + k];
    JAXHC_ROT_UNROLL_GROUP
    for (int h = 1; h < Tm::kLanes; h *= 2)
      JAXHC_ROT_UNROLL_GROUP
      for (int k = 0; k < G; ++k) a[k] = Tm::lane_butterfly(a[k], h);
    row_stages<Tm, G>(a);
    JAXHC_ROT_UNROLL_GROUP
    for (int k = 0; k < G; ++k) v[g + k] = a[k];
  }
  strided_stages<Tm, R, G>(v);
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

// --- q4:h's scale choice -------------------------------------------------------------------------
// Step 4 for 4 bits tries kScales scales G_c = sigma * f_c (f = 1, 0.9, 1.1; float64 products):
// candidate c's thresholds are T_j^c = floor(t_j * G_c) and its index k_c(y) = how many of them lie
// below |y|. Its exact integer sums A_c = sum |y_i| L(k_c(y_i)) and Q_c = sum L(k_c(y_i))^2 (L in
// units of 2^-16: |y| L < 2^48, A_c < 2^58) give the least-squares gain for those indices,
// g_c = 2^16 A_c / Q_c, kept within [sigma / 2, 3 sigma / 2], and the squared error of the block
// decoded with it, up to a term the same for all c: e_c = g_c (g_c Q_c - 2^17 A_c) (float64, one
// fixed sequence of correctly rounded operations). The block takes the c of the least e_c (the
// lowest c of equal ones): its thresholds give the codes and g_c the scale (step 5 with g_c for
// sigma). Decoding is unchanged. The factors keep every T_j^0.9 in (T_(j-1)^1, T_j^1] and every
// T_j^1.1 in [T_j^1, T_(j+1)^1) (t_(j+1) / t_j >= 1.3), so k_0.9 = k_1 + (|y| > T_(k_1)^0.9) and
// k_1.1 = k_1 - (T_(k_1 - 1)^1.1 + 1 > |y|): the teams find k_1 and step from it.
constexpr int kScales = 3;

JAXHC_HD double dmul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
JAXHC_HD double scale_factor(int c) { return c == 1 ? 0.9 : c == 2 ? 1.1 : 1.0; }

// Per block: each candidate's thresholds (padded to 8 with kNoThreshold), the steps from k_1 --
// up[k] = T_k^0.9 (kNoThreshold for k = 7), down[k] = T_(k-1)^1.1 + 1 (0 for k = 0) -- and the
// positive levels.
struct ScaleTables {
  alignas(32) int32_t thr[kScales][8];
  alignas(32) int32_t up[8];
  alignas(32) int32_t down[8];
  alignas(32) int32_t level[8];
};

// `t`, `levels`: kThresholds4, kLevels4 (passed in: device tables on CUDA).
JAXHC_HD void scale_tables(const float* t, const int32_t* levels, double sigma, ScaleTables* s) {
  for (int c = 0; c < kScales; ++c)
    fixed_thresholds(t, 4, dmul(sigma, scale_factor(c)), s->thr[c]);
  for (int k = 0; k < 8; ++k) {
    s->up[k] = s->thr[1][k];
    s->down[k] = k ? s->thr[2][k - 1] + 1 : 0;
    s->level[k] = levels[k];
  }
}

// The candidate of the least error from the sums A[c], Q[c]; *gain: its g_c.
JAXHC_HD int pick_scale(double sigma, const int64_t* A, const int64_t* Q, double* gain) {
  int best = 0;
  double best_e = 0.0;
  for (int c = 0; c < kScales; ++c) {
    const double a = dmul(static_cast<double>(A[c]), 65536.0), q = static_cast<double>(Q[c]);
#if defined(__CUDA_ARCH__)
    double g = __ddiv_rn(a, q);
    g = fmin(fmax(g, dmul(sigma, 0.5)), dmul(sigma, 1.5));
    const double e = __dmul_rn(g, __dsub_rn(__dmul_rn(g, q), __dmul_rn(2.0, a)));
#else
    double g = a / q;  // finite and >= 0 (q > 0): comparisons clamp it as fmin/fmax would
    const double lo = sigma * 0.5, hi = sigma * 1.5;
    g = g < lo ? lo : g > hi ? hi : g;
    const double e = g * (g * q - 2.0 * a);
#endif
    if (c == 0 || e < best_e) {
      best = c;
      best_e = e;
      *gain = g;
    }
  }
  return best;
}

// For a team with, beside the transform's operations: I (kLanes int64 sums), izero(),
// product_add(i, a, b) (i + a * b lane by lane, a, b >= 0), itotal(i) (int64); absolute(v);
// index4(a, thr) (k_1: a binary search over 8 thresholds); lookup8(k, tab) (tab[k], k < 8);
// plus_if(k, a, b) / minus_if(k, a, b) (k + 1 / k - 1 where a > b, else k).

// The indices of a row's |y| = a under each candidate: k[0] = k_1, k[1] = k_0.9, k[2] = k_1.1.
template <class Tm>
JAXHC_HD void row_indices(typename Tm::V a, const ScaleTables& s, typename Tm::V* k) {
  k[0] = Tm::index4(a, s.thr[0]);
  k[1] = Tm::plus_if(k[0], a, Tm::lookup8(k[0], s.up));
  k[2] = Tm::minus_if(k[0], Tm::lookup8(k[0], s.down), a);
}

// A row's terms of the sums: a_sum[c] += a L(k[c]), q_sum[c] += L(k[c])^2.
template <class Tm>
JAXHC_HD void row_sums(typename Tm::V a, const typename Tm::V* k, const ScaleTables& s,
                       typename Tm::I* a_sum, typename Tm::I* q_sum) {
  for (int c = 0; c < kScales; ++c) {
    const typename Tm::V lv = Tm::lookup8(k[c], s.level);
    a_sum[c] = Tm::product_add(a_sum[c], a, lv);
    q_sum[c] = Tm::product_add(q_sum[c], lv, lv);
  }
}

// The sums A_c, Q_c of R rows (y in the rows). idx null: one pass, each row's indices and then
// their terms. Else two passes, keeping the indices in idx[r][0..kScales): every row's indices
// first, then the sums; each pass is a short chain of dependent operations per row, which an
// out-of-order CPU overlaps across rows better than the one long chain. The same integers.
template <class Tm, int R>
JAXHC_HD void scale_sums(const typename Tm::V* v, const ScaleTables& s, int64_t* A, int64_t* Q,
                         typename Tm::V (*idx)[kScales] = nullptr) {
  using V = typename Tm::V;
  typename Tm::I a_sum[kScales], q_sum[kScales];
  for (int c = 0; c < kScales; ++c) a_sum[c] = q_sum[c] = Tm::izero();
  if (idx) {
    JAXHC_ROT_UNROLL
    for (int r = 0; r < R; ++r) row_indices<Tm>(Tm::absolute(v[r]), s, idx[r]);
    JAXHC_ROT_UNROLL
    for (int r = 0; r < R; ++r) row_sums<Tm>(Tm::absolute(v[r]), idx[r], s, a_sum, q_sum);
  } else {
    JAXHC_ROT_UNROLL
    for (int r = 0; r < R; ++r) {
      const V a = Tm::absolute(v[r]);
      V k[kScales];
      row_indices<Tm>(a, s, k);
      row_sums<Tm>(a, k, s, a_sum, q_sum);
    }
  }
  for (int c = 0; c < kScales; ++c) {
    A[c] = Tm::itotal(a_sum[c]);
    Q[c] = Tm::itotal(q_sum[c]);
  }
}

// Step 4 and 5 of q4:h after the transform: the chosen candidate's thresholds into thr[0..8), its
// gain returned (`t`, `levels`: as for scale_tables). idx: as for scale_sums; *chosen: the
// candidate (idx[r][*chosen] are then the rows' code indices).
template <class Tm, int R>
JAXHC_HD double choose_scale(const typename Tm::V* v, double sigma, const float* t,
                             const int32_t* levels, int32_t* thr,
                             typename Tm::V (*idx)[kScales] = nullptr, int* chosen = nullptr) {
  ScaleTables s;
  scale_tables(t, levels, sigma, &s);
  int64_t A[kScales], Q[kScales];
  scale_sums<Tm, R>(v, s, A, Q, idx);
  double gain = sigma;
  const int c = pick_scale(sigma, A, Q, &gain);
  for (int j = 0; j < 8; ++j) thr[j] = s.thr[c][j];
  if (chosen) *chosen = c;
  return gain;
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
  using I = int64_t;
  static JAXHC_HD I izero() { return 0; }
  static JAXHC_HD I product_add(I i, V a, V b) { return i + int64_t{a} * b; }
  static JAXHC_HD int64_t itotal(I i) { return i; }
  static JAXHC_HD V absolute(V v) { return v < 0 ? -v : v; }
  static JAXHC_HD V index4(V a, const int32_t* thr) {
    int k = 0;
    for (int step = 4; step; step >>= 1)
      if (a > thr[k + step - 1]) k += step;
    return k;
  }
  static JAXHC_HD V lookup8(V k, const int32_t* tab) { return tab[k]; }
  static JAXHC_HD V plus_if(V k, V a, V b) { return a > b ? k + 1 : k; }
  static JAXHC_HD V minus_if(V k, V a, V b) { return a > b ? k - 1 : k; }
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
