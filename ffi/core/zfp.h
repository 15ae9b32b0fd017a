// ZFP fixed-rate 1-D codec core (float32/float64), host and device code.
//
// The stream is the one zfp 1.0.1 writes for a 1-D array in fixed-rate mode (zfpy.compress_numpy(x,
// rate=R, write_header=False)): 64-bit little-endian words filled LSB first; block b of 4 values
// occupies exactly maxbits bits from bit b * maxbits; the stream is zero-padded to a whole word.
// A block is: one bit "nonzero"; if set, the biased common exponent (EBITS bits), then the
// coefficients of the block-floating-point integers after zfp's lifting transform, in negabinary,
// coded bit plane by bit plane with group tests (core/zfp_planes.h), truncated or zero-padded to
// maxbits.
//
// Everything that must agree with zfp bit for bit works on the bits of the values (exponents,
// mantissa shifts), never on float arithmetic that could see a subnormal: XLA:CPU runs handlers
// with denormals flushed to zero, and zfp itself does not. The few cases where zfp relies on
// undefined C behaviour (a scale factor that overflows to inf, NaN or inf cast to an integer) are
// reproduced as x86-64 executes them (the integer becomes INT_MIN), so CPU and GPU write the same
// stream as zfpy.
#pragma once
#include <cstring>
#include <string>

#include "core/common.h"
#include "core/floats.h"
#include "core/rows.h"
#include "core/zfp_planes.h"

namespace jaxhc {
namespace zfp {

// Values per block of the dims-D layouts (core/zfp_nd.h): 4, 16 or 64.
JAXHC_HD constexpr int block_values(int dims) { return 1 << (2 * dims); }

// Bytes of the stream of n values at maxbits bits per block of 4^dims values, padded to 64-bit
// words.
JAXHC_HD uint64_t payload_bytes(uint64_t n, uint32_t maxbits, int dims) {
  const uint64_t s = static_cast<uint64_t>(block_values(dims));
  uint64_t bits = ((n + s - 1) / s) * maxbits;
  return ((bits + 63) / 64) * 8;
}

template <typename Scalar>
struct Traits;

template <>
struct Traits<float> {
  using Int = int32_t;
  using UInt = uint32_t;
  static constexpr int kEbits = 8, kEbias = 127, kMantBits = 23;
};

template <>
struct Traits<double> {
  using Int = int64_t;
  using UInt = uint64_t;
  static constexpr int kEbits = 11, kEbias = 1023, kMantBits = 52;
};

// Constants of the format derived from the scalar type.
template <typename Scalar>
struct Format : Traits<Scalar> {
  using T = Traits<Scalar>;
  using UInt = typename T::UInt;
  static constexpr int kIntPrec = 8 * sizeof(Scalar);  // bits of the block-floating-point integers
  static constexpr int kMinBits = 1 + T::kEbits;       // a block holds at least its exponent
  static constexpr int kMaxBits = 4 * kIntPrec;        // ... and never more than 4 full integers
  static constexpr int kWords = kMaxBits / 64;         // 64-bit words of one block's bits, at most
  // The same for a block of 4^dims values.
  static constexpr int max_bits(int dims) { return block_values(dims) * kIntPrec; }
  static constexpr int kMinSubExp = 1 - T::kEbias - T::kMantBits;  // of the smallest subnormal
  static constexpr UInt kSign = UInt(1) << (kIntPrec - 1);  // also INT_MIN as two's complement
  static constexpr UInt kInf = UInt(2 * T::kEbias + 1) << T::kMantBits;
  static constexpr UInt kMant = (UInt(1) << T::kMantBits) - 1;
  static constexpr UInt kNbMask = UInt(0xaaaaaaaaaaaaaaaaull);  // negabinary mask
};

template <typename Scalar>
JAXHC_HD bool valid_maxbits(int64_t maxbits, int64_t dims) {
  return dims >= 1 && dims <= 3 && maxbits >= Format<Scalar>::kMinBits &&
         maxbits <= Format<Scalar>::max_bits(static_cast<int>(dims));
}

namespace detail {

template <typename Scalar>
JAXHC_HD typename Traits<Scalar>::UInt to_bits(Scalar x) {
  typename Traits<Scalar>::UInt u;
  memcpy(&u, &x, sizeof u);
  return u;
}

template <typename Scalar>
JAXHC_HD Scalar from_bits(typename Traits<Scalar>::UInt u) {
  Scalar x;
  memcpy(&x, &u, sizeof x);
  return x;
}

// zfp's maximum number of coded bit planes (precision() for dims-D, maxprec 64, minexp -1074).
JAXHC_HD int precision(int emax, int dims = 1) {
  int p = emax + 1074 + 2 * (dims + 1);
  return p < 0 ? 0 : p > 64 ? 64 : p;
}

// frexp exponent of the largest finite-or-inf magnitude (NaN ignored, as zfp's `max < f` does),
// with zfp's clamps: 0 -> -EBIAS, subnormal -> 1 - EBIAS; inf -> 0 (glibc's frexp leaves it 0).
template <typename Scalar>
JAXHC_HD int block_emax(typename Traits<Scalar>::UInt amax) {
  using F = Format<Scalar>;
  if (amax == 0) return -F::kEbias;
  if (amax == F::kInf) return 0;
  int e = static_cast<int>(amax >> F::kMantBits);
  return e ? e - (F::kEbias - 1) : 1 - F::kEbias;
}

// zfp's (Int)(x * 2^shift) with x the value of `bits`, truncated toward zero; INT_MIN where the
// product is NaN, inf or out of range (what the x86-64 conversion gives zfpy).
template <typename Scalar>
JAXHC_HD typename Traits<Scalar>::UInt fwd_cast(typename Traits<Scalar>::UInt bits, int shift) {
  using F = Format<Scalar>;
  using UInt = typename F::UInt;
  UInt a = bits & ~F::kSign;
  if (a == 0) return 0;
  if (a >= F::kInf) return F::kSign;
  int e = static_cast<int>(a >> F::kMantBits);
  UInt m = a & F::kMant;
  if (e)
    m |= F::kMant + 1;
  else
    e = 1;
  int sh = e - F::kEbias - F::kMantBits + shift;  // |x| * 2^shift = m * 2^sh
  UInt mag;
  if (sh >= 0) {
    if (sh + (F::kIntPrec - clz(m)) > F::kIntPrec - 1) return F::kSign;
    mag = m << sh;
  } else {
    mag = -sh >= F::kIntPrec ? 0 : m >> -sh;
  }
  return (bits & F::kSign) ? UInt(0) - mag : mag;
}

// zfp's (Scalar)i * ldexp(1, shift) for a shift that makes the factor subnormal or zero (the
// factor rounds to 0 below the smallest subnormal). The product of an integer and a subnormal
// power of two is exact, so only int -> float rounds; the result is composed from its bits.
template <typename Scalar>
JAXHC_HD Scalar scale_small(typename Traits<Scalar>::Int i, int shift) {
  using F = Format<Scalar>;
  using UInt = typename F::UInt;
  UInt fb = to_bits(static_cast<Scalar>(i));  // an integer: normal or zero, exact in any FTZ mode
  UInt sign = fb & F::kSign, a = fb & ~F::kSign;
  if (a == 0 || shift < F::kMinSubExp) return from_bits<Scalar>(sign);
  int e = static_cast<int>(a >> F::kMantBits) + shift;  // biased exponent of the product
  if (e >= 1) return from_bits<Scalar>(sign | (UInt(e) << F::kMantBits) | (a & F::kMant));
  UInt sig = (a & F::kMant) | (F::kMant + 1);
  return from_bits<Scalar>(sign | (sig >> (1 - e)));  // subnormal, shifted-out bits are zero
}

// zfp's lifting transforms on two's complement integers held as UInt (wrapping like zfp's ints).
template <typename Scalar>
JAXHC_HD typename Traits<Scalar>::UInt asr(typename Traits<Scalar>::UInt x, int s) {
  using Int = typename Traits<Scalar>::Int;
  return static_cast<typename Traits<Scalar>::UInt>(static_cast<Int>(x) >> s);
}

// The lifts of 4 values at stride s (1 for a 1-D block; 4 and 16 along y and z of core/zfp_nd.h).
template <typename Scalar>
JAXHC_HD void fwd_lift(typename Traits<Scalar>::UInt* p, int s = 1) {
  auto x = p[0], y = p[s], z = p[2 * s], w = p[3 * s];
  x += w; x = asr<Scalar>(x, 1); w -= x;
  z += y; z = asr<Scalar>(z, 1); y -= z;
  x += z; x = asr<Scalar>(x, 1); z -= x;
  w += y; w = asr<Scalar>(w, 1); y -= w;
  w += asr<Scalar>(y, 1); y -= asr<Scalar>(w, 1);
  p[0] = x, p[s] = y, p[2 * s] = z, p[3 * s] = w;
}

template <typename Scalar>
JAXHC_HD void inv_lift(typename Traits<Scalar>::UInt* p, int s = 1) {
  auto x = p[0], y = p[s], z = p[2 * s], w = p[3 * s];
  y += asr<Scalar>(w, 1); w -= asr<Scalar>(y, 1);
  y += w; w <<= 1; w -= y;
  z += x; x <<= 1; x -= z;
  y += z; z <<= 1; z -= y;
  w += x; x <<= 1; x -= w;
  p[0] = x, p[s] = y, p[2 * s] = z, p[3 * s] = w;
}

// The largest magnitude among the bits of S values, NaN left out (zfp's `max < f` is false for
// it); clears *finite if one of them is NaN or inf. 0: every value is +-0.
template <int S, typename Scalar>
JAXHC_HD typename Traits<Scalar>::UInt block_amax(const typename Traits<Scalar>::UInt* bits,
                                                  bool* finite) {
  using F = Format<Scalar>;
  using UInt = typename F::UInt;
  UInt amax = 0;
  bool fin = true;
  for (int i = 0; i < S; i++) {
    UInt a = bits[i] & ~F::kSign;
    fin &= a < F::kInf;
    a &= UInt(0) - UInt(a <= F::kInf);
    amax ^= (amax ^ a) & (UInt(0) - UInt(a > amax));  // branch-free: data decide too often
  }
  *finite = fin;
  return amax;
}

// zfp's fwd_cast: the S values (v, their bits) as block-floating-point integers for emax.
template <int S, typename Scalar>
JAXHC_HD void fwd_cast_block(const Scalar* v, const typename Traits<Scalar>::UInt* bits,
                             bool finite, int emax, typename Traits<Scalar>::UInt* u) {
  using F = Format<Scalar>;
  using UInt = typename F::UInt;
  int shift = F::kIntPrec - 2 - emax;  // zfp scales by 2^shift; beyond EBIAS that is inf
  if (finite && shift < F::kEbias) {
    // A normal factor and |x| * 2^shift < 2^(intprec - 2): float arithmetic is exact up to the
    // truncation, and subnormal x (which a flush to zero would drop) give |product| < 1 anyway.
    Scalar s = from_bits<Scalar>(UInt(shift + F::kEbias) << F::kMantBits);
    for (int i = 0; i < S; i++) u[i] = static_cast<UInt>(static_cast<typename F::Int>(v[i] * s));
  } else {
    for (int i = 0; i < S; i++)
      u[i] = shift > F::kEbias ? F::kSign : fwd_cast<Scalar>(bits[i], shift);
  }
}

// zfp's inv_cast: the S integers u (two's complement) as values for emax.
template <int S, typename Scalar>
JAXHC_HD void inv_cast_block(const typename Traits<Scalar>::UInt* u, int emax, Scalar* v) {
  using F = Format<Scalar>;
  using UInt = typename F::UInt;
  using Int = typename F::Int;
  int shift = emax - (F::kIntPrec - 2);
  if (shift >= 1 - F::kEbias) {  // a normal factor: products are normal, 0 or inf, FTZ or not
    Scalar s = from_bits<Scalar>(UInt(shift + F::kEbias) << F::kMantBits);
    for (int i = 0; i < S; i++) v[i] = static_cast<Scalar>(static_cast<Int>(u[i])) * s;
  } else {
    for (int i = 0; i < S; i++) v[i] = scale_small<Scalar>(static_cast<Int>(u[i]), shift);
  }
}

}  // namespace detail

using detail::PortableBits;

// Block b of x[0, n) as zfp codes it (widened to the coded type): a partial last block padded
// by zfp's pad_block.
template <typename T>
JAXHC_HD void load_block(const T* x, uint64_t n, uint64_t b, typename Elems<T>::Coded* v) {
  const T* p = x + 4 * b;
  uint64_t m = n - 4 * b;
  v[0] = Elems<T>::widen(p[0]);
  v[1] = m > 1 ? Elems<T>::widen(p[1]) : v[0];
  v[2] = m > 2 ? Elems<T>::widen(p[2]) : v[1];
  v[3] = m > 3 ? Elems<T>::widen(p[3]) : v[0];
}

// Where encode_block appends its bits: anything with put(v, n) that appends the n low bits of v
// (0 <= n <= 64, no bits above them set). BlockBits holds one block's bits; the CPU handlers
// append straight to the stream.
template <int Words>
struct BlockBits {
  uint64_t w[Words] = {};
  int pos = 0;
  JAXHC_HD void put(uint64_t v, int n) {
    if (v) detail::put_bits(w, pos, v, n);
    pos += n;
  }
};

template <typename Sink>
JAXHC_HD void put_zeros(Sink& out, int n) {
  for (; n > 0; n -= 64) out.put(0, n < 64 ? n : 64);
}

// The head of a nonzero block (largest magnitude amax): a 1 bit and the biased exponent emax,
// which it returns. (A block of zeros is a single 0 bit, then padding.)
template <typename Scalar, typename Sink>
JAXHC_HD int put_exponent(typename Traits<Scalar>::UInt amax, Sink& out) {
  using F = Format<Scalar>;
  int emax = detail::block_emax<Scalar>(amax);
  out.put(2 * static_cast<uint64_t>(emax + F::kEbias) + 1, F::kMinBits);
  return emax;
}

// The exponent of a block's bits in[0, ...) (those of a nonzero block: in[0] & 1).
template <typename Scalar>
JAXHC_HD int get_exponent(const uint64_t* in) {
  using F = Format<Scalar>;
  return static_cast<int>((in[0] >> 1) & ((1u << F::kEbits) - 1)) - F::kEbias;
}

// Appends the code of 4 values to out: exactly maxbits bits (valid_maxbits). Returns whether all
// 4 values are finite.
template <typename Bits = PortableBits, typename Scalar, typename Sink>
JAXHC_HD bool encode_block(const Scalar* v, int maxbits, Sink& out) {
  using F = Format<Scalar>;
  using UInt = typename F::UInt;
  UInt bits[4], u[4];
  memcpy(bits, v, sizeof bits);  // (straight from memory into integer registers)
  bool finite;
  UInt amax = detail::block_amax<4, Scalar>(bits, &finite);
  if (!amax) {
    put_zeros(out, maxbits);
    return finite;
  }
  int emax = put_exponent<Scalar>(amax, out);
  detail::fwd_cast_block<4>(v, bits, finite, emax, u);
  detail::fwd_lift<Scalar>(u);
  for (int i = 0; i < 4; i++) u[i] = (u[i] + F::kNbMask) ^ F::kNbMask;
  int budget = maxbits - F::kMinBits;
  put_zeros(out, budget - detail::encode_ints<Bits>(u, detail::precision(emax), out, budget));
  return finite;
}

// Decodes one block from its maxbits bits in in[0, ceil(maxbits / 64)).
template <typename Bits = PortableBits, typename Scalar>
JAXHC_HD void decode_block(const uint64_t* in, int maxbits, Scalar* v) {
  using F = Format<Scalar>;
  using UInt = typename F::UInt;
  if (!(in[0] & 1)) {
    v[0] = v[1] = v[2] = v[3] = Scalar(0);
    return;
  }
  int emax = get_exponent<Scalar>(in);
  UInt u[4] = {0, 0, 0, 0};
  detail::decode_ints<Bits>(in, detail::precision(emax), u, F::kMinBits, maxbits);
  for (int i = 0; i < 4; i++) u[i] = (u[i] ^ F::kNbMask) - F::kNbMask;
  detail::inv_lift<Scalar>(u);
  detail::inv_cast_block<4>(u, emax, v);
}

// Word w of the stream of x[0, n): the codes of all blocks with bits in it, each block coded
// whole (the CUDA encoder runs one thread per word: threads share nothing). Clears *finite if one
// of those blocks is not finite.
template <typename T>
JAXHC_HD uint64_t encode_word(const T* x, uint64_t n, int maxbits, uint64_t w, bool* finite) {
  using Scalar = typename Elems<T>::Coded;
  uint64_t lo = 64 * w, blocks = (n + 3) / 4;  // the word holds stream bits [lo, lo + 64)
  uint64_t end = (lo + 64 + maxbits - 1) / maxbits;
  if (end > blocks) end = blocks;
  uint64_t word = 0;
  for (uint64_t b = lo / maxbits; b < end; b++) {
    Scalar v[4];
    load_block(x, n, b, v);
    BlockBits<Format<Scalar>::kWords> bits;
    if (!encode_block(v, maxbits, bits)) *finite = false;
    int64_t off = static_cast<int64_t>(b * maxbits) - static_cast<int64_t>(lo);
    if (off >= 0)  // the block starts inside this word
      word |= bits.w[0] << off;
    else  // it started in an earlier word: its bits from -off on
      word |= detail::get_bits(bits.w, static_cast<int>(-off),
                               static_cast<int>(maxbits + off < 64 ? maxbits + off : 64));
  }
  return word;
}

// 64 stream bits from bit pos of a stream of nwords words (reads nothing past the stream's end).
JAXHC_HD uint64_t stream_bits(const uint64_t* words, uint64_t nwords, uint64_t pos) {
  uint64_t q = pos >> 6;
  int s = static_cast<int>(pos & 63);
  uint64_t v = words[q] >> s;
  if (s && q + 1 < nwords) v |= words[q + 1] << (64 - s);
  return v;
}

// The bits of block b (of a row's stream) into in[0, ceil(maxbits / 64)).
JAXHC_HD void load_block_bits(const uint64_t* words, uint64_t nwords, uint64_t b, int maxbits,
                              uint64_t* in) {
  uint64_t pos = b * static_cast<uint64_t>(maxbits);
  in[0] = stream_bits(words, nwords, pos);
  for (int i = 1; 64 * i < maxbits; i++) in[i] = stream_bits(words, nwords, pos + 64 * i);
}

using ::jaxhc::Rows;

// Host side of both modules: the rows of one call checked against the buffer contract of
// ffi/cpu/handlers.h (values [..., n], payload [..., payload_bytes(n)], flags [...] for encode).
// Dims: anything with size() and operator[] (ffi::Span). Returns an error message, "" if valid.
template <typename Scalar, typename Dims>
std::string check_rows(const Dims& values, const Dims& payload, const Dims* flags, int64_t maxbits,
                       int64_t dims, Rows* r) {
  using F = Format<Scalar>;
  if (dims < 1 || dims > 3) return "dims " + std::to_string(dims) + " is not 1, 2 or 3";
  if (!valid_maxbits<Scalar>(maxbits, dims))
    return "maxbits " + std::to_string(maxbits) + " is out of range " +
           std::to_string(F::kMinBits) + ".." + std::to_string(F::max_bits(int(dims))) +
           " for float" + std::to_string(F::kIntPrec) + " in " + std::to_string(dims) + "-D";
  auto bytes = [&](uint64_t n) {
    return payload_bytes(n, static_cast<uint32_t>(maxbits), static_cast<int>(dims));
  };
  return check_row_shapes(values, payload, flags, bytes,
                          "at maxbits " + std::to_string(maxbits) + " in " +
                              std::to_string(dims) + "-D",
                          r);
}

}  // namespace zfp
}  // namespace jaxhc
