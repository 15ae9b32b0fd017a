// ZFP fixed-rate 2-D and 3-D codec core (float32/float64), host and device code, beside the 1-D
// coder of core/zfp.h (whose stream conventions, exponent and block-floating-point conversion it
// shares).
//
// A row of n values is laid out as the numpy array (ceil(n / 4), 4) in 2-D or (ceil(n / 16), 4, 4)
// in 3-D (zfp's x the last axis), so block b is the 4^dims consecutive values from 4^dims * b, value
// i + 4 j + 16 k at (x, y, z) = (i, j, k). The stream is zfpy.compress_numpy(a, rate=R,
// write_header=False) of that array, the last row (and in 3-D the last 4x4 plane) completed as zfp
// pads a partial block (pad_block: a row of m < 4 values continues with v1 = v0 (m = 1), v2 = v1,
// v3 = v0), first along x in the last row, then along y in the last plane, then along z.
//
// A block: one bit "nonzero"; if set, the biased common exponent, then the block-floating-point
// integers after zfp's lifting transform along x, then y (then z), reordered by sequency (kPerm2,
// kPerm3), in negabinary, coded bit plane by bit plane with group tests over 16 or 64 coefficients
// (zfp's encode_few_ints), truncated or zero-padded to maxbits.
#pragma once
#include "core/zfp.h"

namespace jaxhc {
namespace zfp {

// 64-bit words of a dims-D block's bits, at most (for the scalar type).
template <int D, typename Scalar>
inline constexpr int kBlockWords = Format<Scalar>::max_bits(D) / 64;

namespace detail {

// zfp's coefficient order: by total sequency i + j (+ k), the order zfp's perm_2 / perm_3 list
// within a sequency (index i + 4 j + 16 k). The CUDA build reads them from constant memory.
#define JAXHC_ZFP_PERM2 {0, 1, 4, 5, 2, 8, 6, 9, 3, 12, 10, 7, 13, 11, 14, 15}
#define JAXHC_ZFP_PERM3 \
  {0,  1,  4, 16, 20, 17,  5,  2,  8, 32, 21,  6, 18, 24,  9, 33, \
   36,  3, 12, 48, 22, 25, 37, 40, 34, 10,  7, 19, 28, 13, 49, 52, \
   41, 38, 26, 23, 29, 53, 11, 35, 44, 14, 50, 56, 42, 27, 39, 45, \
   30, 54, 57, 60, 51, 15, 43, 46, 58, 61, 55, 31, 62, 59, 47, 63}

#if defined(__CUDACC__)
static __constant__ uint8_t kPerm2Dev[16] = JAXHC_ZFP_PERM2;
static __constant__ uint8_t kPerm3Dev[64] = JAXHC_ZFP_PERM3;
#endif
inline constexpr uint8_t kPerm2[16] = JAXHC_ZFP_PERM2;
inline constexpr uint8_t kPerm3[64] = JAXHC_ZFP_PERM3;

template <int D>
JAXHC_HD int perm(int i) {
#if defined(__CUDA_ARCH__)
  return D == 2 ? kPerm2Dev[i] : kPerm3Dev[i];
#else
  return D == 2 ? kPerm2[i] : kPerm3[i];
#endif
}

// zfp's pad_block: values m.. of a row of 4 at stride s (0 < m < 4) from the first m.
template <typename V>
JAXHC_HD void pad_row(V* p, int m, int s) {
  if (m < 2) p[s] = p[0];
  if (m < 3) p[2 * s] = p[s];
  p[3 * s] = p[0];
}

// zfp's forward decorrelating transform: the lifts along x, then y, then z.
template <int D, typename Scalar>
JAXHC_HD void fwd_xform(typename Traits<Scalar>::UInt* p) {
  constexpr int S = block_values(D);
  for (int r = 0; r < S; r += 4) fwd_lift<Scalar>(p + r, 1);
  for (int z = 0; z < S; z += 16)
    for (int x = 0; x < 4; x++) fwd_lift<Scalar>(p + z + x, 4);
  if (D == 3)
    for (int i = 0; i < 16; i++) fwd_lift<Scalar>(p + i, 16);
}

// Its inverse: the inverse lifts along z, then y, then x.
template <int D, typename Scalar>
JAXHC_HD void inv_xform(typename Traits<Scalar>::UInt* p) {
  constexpr int S = block_values(D);
  if (D == 3)
    for (int i = 0; i < 16; i++) inv_lift<Scalar>(p + i, 16);
  for (int z = 0; z < S; z += 16)
    for (int x = 0; x < 4; x++) inv_lift<Scalar>(p + z + x, 4);
  for (int r = 0; r < S; r += 4) inv_lift<Scalar>(p + r, 1);
}

// The bits j..2j-1 of every 2j bits clear, the others set (j a power of 2 below the width).
template <typename UInt>
constexpr UInt low_stripes(int j) {
  UInt m = 0;
  for (int p = 0; p < 8 * static_cast<int>(sizeof(UInt)); p += 2 * j)
    m |= static_cast<UInt>((UInt(1) << j) - 1) << p;
  return m;
}

// Transposes the N x N bit matrix a (N = bits of UInt; row r = a[r], column c = bit c): a[c] bit
// r takes a[r] bit c. Recursive block swaps: stage J exchanges the off-diagonal J x J halves of
// every 2J x 2J block (rows k and k + J, J consecutive rows at a time: loops that vectorize).
template <int J, typename UInt>
JAXHC_HD void transpose_stage(UInt* a) {
  constexpr int N = 8 * sizeof(UInt);
  constexpr UInt m = low_stripes<UInt>(J);
  for (int b = 0; b < N; b += 2 * J) {
    for (int k = b; k < b + J; k++) {
      UInt t = ((a[k] >> J) ^ a[k + J]) & m;
      a[k + J] ^= t;
      a[k] ^= t << J;
    }
  }
  if constexpr (J > 1) transpose_stage<J / 2>(a);
}

template <typename UInt>
JAXHC_HD void transpose_bits(UInt* a) {
  transpose_stage<4 * sizeof(UInt)>(a);
}

// The bit planes of S coefficients: planes[k] bit i = bit k of c[i], k < bits of UInt.
template <int S, typename UInt>
JAXHC_HD void to_planes(const UInt* c, uint64_t* planes) {
  constexpr int N = 8 * sizeof(UInt);
  for (int g = 0; g < S; g += N) {
    UInt a[N];
    for (int r = 0; r < N; r++) a[r] = g + r < S ? c[g + r] : UInt(0);
    transpose_bits(a);
    for (int k = 0; k < N; k++) planes[k] = (g ? planes[k] : 0) | static_cast<uint64_t>(a[k]) << g;
  }
}

// The inverse: the S coefficients of the planes.
template <int S, typename UInt>
JAXHC_HD void from_planes(const uint64_t* planes, UInt* c) {
  constexpr int N = 8 * sizeof(UInt);
  for (int g = 0; g < S; g += N) {
    UInt a[N];
    for (int k = 0; k < N; k++) a[k] = static_cast<UInt>(planes[k] >> g);
    transpose_bits(a);
    for (int r = 0; r < N && g + r < S; r++) c[g + r] = a[r];
  }
}

// zfp's encode_few_ints for S <= 64 coefficients given as their bit planes (to_planes; prec of
// them): at most `budget` bits appended to out; returns how many. A plane codes as the bits of its
// n significant coefficients, then group tests: 1 and a scan to the next one-bit (t zeros and a 1;
// the one-bit of the last position is implied), or 0 when no one-bit is left. Planes above the top
// one-bit (n = 0) are a single 0 each.
//
// A word at a time: past the n verbatim bits, the rest r of a plane, up to its top one-bit p,
// codes as 1, then r's bits with a 1 after every one-bit below p (the next group test), then
// "10" (p and the final group test), or nothing when p is the last position (implied).
template <int S, int prec, typename Bits, typename Sink>
JAXHC_HD int encode_planes(const uint64_t* planes, int maxprec, Sink& out, int budget) {
  const int kmin = prec > maxprec ? prec - maxprec : 0;
  int top = prec - 1;
  while (top >= 0 && !planes[top]) top--;
  if (top < kmin) top = kmin - 1;
  int pos = min_int(prec - 1 - top, budget), n = 0;
  put_zeros(out, pos);
  auto emit = [&](uint64_t v, int len) {  // v's len low bits, cut at the budget
    int cut = min_int(len, budget - pos);
    if (cut > 0) out.put(low_bits(v, cut), cut);
    pos += len;
  };
  for (int k = top; pos < budget && k >= kmin; k--) {
    uint64_t x = planes[k];
    emit(x, n);
    if (n == S || pos >= budget) continue;
    uint64_t r = x >> n;  // n < S <= 64
    if (!r) {
      emit(0, 1);
      continue;
    }
    int p = 63 - clz64(r);
    uint64_t q = r ^ (uint64_t{1} << p);
    emit(1, 1);
    uint64_t lo = Bits::double_ones(static_cast<uint32_t>(q));
    int pop_lo = popcount32(static_cast<uint32_t>(q));
    if (p <= 32) {
      emit(lo, p + pop_lo);
    } else {
      emit(lo, 32 + pop_lo);
      emit(Bits::double_ones(static_cast<uint32_t>(q >> 32)),
           p - 32 + popcount32(static_cast<uint32_t>(q >> 32)));
    }
    if (n + p != S - 1) emit(1, 2);
    n += p + 1;
  }
  return min_int(pos, budget);
}

// zfp's decode_few_ints: the bit planes (prec of them) of the coefficients coded in bits
// [pos, end) of in. Where the budget ends inside a scan, the scanned position takes the one-bit,
// as in zfp.
template <int S, int prec>
JAXHC_HD void decode_planes(const uint64_t* in, int maxprec, uint64_t* planes, int pos, int end) {
  const int kmin = prec > maxprec ? prec - maxprec : 0;
  for (int k = 0; k < prec; k++) planes[k] = 0;
  int n = 0;
  for (int k = prec - 1; pos < end && k >= kmin; k--) {
    int m = min_int(n, end - pos);
    uint64_t x = m ? get_bits(in, pos, m) : 0;
    pos += m;
    while (pos < end && n < S) {
      if (!get_bits(in, pos++, 1)) break;  // negative group test
      int avail = min_int(end - pos, S - 1 - n);
      if (avail > 0) {
        uint64_t s = get_bits(in, pos, avail);
        int t = s ? ctz64(s) : avail;
        pos += s ? t + 1 : avail;
        n += t;
      }
      x |= uint64_t{1} << n++;
    }
    planes[k] = x;
  }
}

}  // namespace detail

// Block b of x[0, n) in the dims-D layout (widened to the coded type), a partial last block
// padded as the header says.
template <int D, typename T>
JAXHC_HD void load_block_nd(const T* x, uint64_t n, uint64_t b, typename Elems<T>::Coded* v) {
  constexpr int S = block_values(D);
  const T* p = x + S * b;
  uint64_t left = n - S * b;
  int m = left < S ? static_cast<int>(left) : S;
  for (int i = 0; i < m; i++) v[i] = Elems<T>::widen(p[i]);
  if (m == S) return;
  int rows = (m + 3) / 4, planes = (rows + 3) / 4;
  if (m % 4) detail::pad_row(v + 4 * (rows - 1), m % 4, 1);
  if (rows % 4)
    for (int x = 0; x < 4; x++) detail::pad_row(v + 16 * (planes - 1) + x, rows % 4, 4);
  if (D == 3 && planes < 4)
    for (int i = 0; i < 16; i++) detail::pad_row(v + i, planes, 16);
}

// Appends the code of a dims-D block v (4^dims values) to out: exactly maxbits bits
// (valid_maxbits). Returns whether all its values are finite.
template <int D, typename Bits = PortableBits, typename Scalar, typename Sink>
JAXHC_HD bool encode_block_nd(const Scalar* v, int maxbits, Sink& out) {
  using F = Format<Scalar>;
  using UInt = typename F::UInt;
  constexpr int S = block_values(D);
  UInt bits[S], u[S], c[S];
  memcpy(bits, v, sizeof bits);
  bool finite;
  UInt amax = detail::block_amax<S, Scalar>(bits, &finite);
  if (!amax) {
    put_zeros(out, maxbits);
    return finite;
  }
  int emax = put_exponent<Scalar>(amax, out);
  detail::fwd_cast_block<S>(v, bits, finite, emax, u);
  detail::fwd_xform<D, Scalar>(u);
  for (int i = 0; i < S; i++) c[i] = (u[detail::perm<D>(i)] + F::kNbMask) ^ F::kNbMask;
  constexpr int prec = F::kIntPrec;
  uint64_t planes[prec];
  detail::to_planes<S>(c, planes);
  int budget = maxbits - F::kMinBits, maxprec = detail::precision(emax, D);
  put_zeros(out, budget - detail::encode_planes<S, prec, Bits>(planes, maxprec, out, budget));
  return finite;
}

// Decodes a dims-D block from its maxbits bits in in[0, ceil(maxbits / 64)).
template <int D, typename Bits = PortableBits, typename Scalar>
JAXHC_HD void decode_block_nd(const uint64_t* in, int maxbits, Scalar* v) {
  using F = Format<Scalar>;
  using UInt = typename F::UInt;
  constexpr int S = block_values(D);
  if (!(in[0] & 1)) {
    for (int i = 0; i < S; i++) v[i] = Scalar(0);
    return;
  }
  int emax = get_exponent<Scalar>(in);
  UInt c[S], u[S];
  uint64_t planes[F::kIntPrec];
  detail::decode_planes<S, F::kIntPrec>(in, detail::precision(emax, D), planes, F::kMinBits,
                                        maxbits);
  detail::from_planes<S>(planes, c);
  for (int i = 0; i < S; i++) c[i] = (c[i] ^ F::kNbMask) - F::kNbMask;  // (vectorizes)
  for (int i = 0; i < S; i++) u[detail::perm<D>(i)] = c[i];
  detail::inv_xform<D, Scalar>(u);
  detail::inv_cast_block<S>(u, emax, v);
}

// The block coder of dims D (D = 1: core/zfp.h's), for the loops written once for every D.
template <int D, typename T>
JAXHC_HD void load_block_d(const T* x, uint64_t n, uint64_t b, typename Elems<T>::Coded* v) {
  if constexpr (D == 1)
    load_block(x, n, b, v);
  else
    load_block_nd<D>(x, n, b, v);
}

template <int D, typename Bits = PortableBits, typename Scalar, typename Sink>
JAXHC_HD bool encode_block_d(const Scalar* v, int maxbits, Sink& out) {
  if constexpr (D == 1)
    return encode_block<Bits>(v, maxbits, out);
  else
    return encode_block_nd<D, Bits>(v, maxbits, out);
}

template <int D, typename Bits = PortableBits, typename Scalar>
JAXHC_HD void decode_block_d(const uint64_t* in, int maxbits, Scalar* v) {
  if constexpr (D == 1)
    decode_block<Bits>(in, maxbits, v);
  else
    decode_block_nd<D, Bits>(in, maxbits, v);
}

}  // namespace zfp
}  // namespace jaxhc
