// The CPU kernels of the rotated block quantizers q8:h / q4:h (format and arithmetic in
// core/quant_rotated.h): one block at a time, by a team of core/quant_rotated.h -- one value at a
// time (CpuScalar, the portable kernel), 8 AVX2 lanes (Avx2Team; F16C for float16) or 16 AVX-512
// lanes (Avx512Team, cpu/quant_rotated_avx512.h) -- that adds the team's memory moves (values in,
// codes out, levels in, values out). All run core's integer transform and give the same bytes.
// Blocks are independent, so any thread count gives the same bytes. A row's last, partial block
// is encoded from a zero-padded copy (the padding the format codes), so each team compiles one
// encoder a block size. Each kernel's rows are instantiated in a translation unit of its own
// (JAXHC_ROT_KERNEL: cpu/quant_rotated.cc, quant_rotated_avx2.cc, quant_rotated_avx512.cc), so
// that the build compiles them in parallel; all with -ffp-contract=off.
#pragma once
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/quant_rotated.h"
#include "cpu/memory.h"
#include "cpu/quant_avx2.h"
#include "cpu/quant_kernels.h"
#include "cpu/quant_rows.h"

#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // acc[] is written by part 0 first

namespace jaxhc {
namespace quant {
namespace {

template <typename T>
using E = Elems<T>;

#define JAXHC_ROT_INLINE inline __attribute__((always_inline))

constexpr const float* thresholds_of(int bits) { return bits == 8 ? kThresholds8 : kThresholds4; }

// Per position of a block: +1 or -1 (core's negated()), and the float32 sign bit it flips.
// The signed level of every code, for each width. Computed at compile time.
struct Tables {
  int32_t sign[1 << kMaxLog2Block];
  uint32_t sign_bit[1 << kMaxLog2Block];
  int32_t level4[16], level8[256];
  constexpr Tables() : sign(), sign_bit(), level4(), level8() {
    for (uint32_t i = 0; i < (1u << kMaxLog2Block); i++) {
      sign[i] = negated(i) ? -1 : 1;
      sign_bit[i] = negated(i) ? 0x80000000u : 0;
    }
    for (int c = 0; c < 16; c++) level4[c] = c >= 8 ? kLevels4[c - 8] : -kLevels4[7 - c];
    for (int c = 0; c < 256; c++) level8[c] = c >= 128 ? kLevels8[c - 128] : -kLevels8[127 - c];
  }
};
alignas(64) constexpr Tables kTables{};

constexpr const int32_t* signed_levels(int bits) {
  return bits == 8 ? kTables.level8 : kTables.level4;
}

// One value per row: core's rules as they are written.
struct CpuScalar : ScalarTeam {
  // The largest |x| bits of x[0..m).
  template <typename T>
  static JAXHC_ROT_INLINE uint32_t amax(const T* x, uint64_t m) {
    uint32_t a = 0;
    for (uint64_t i = 0; i < m; i++) a = std::max(a, abs_bits(E<T>::widen(x[i])));
    return a;
  }
  template <typename T>
  static JAXHC_ROT_INLINE V load_fixed(const T* x, uint32_t i, float factor) {
    return to_fixed(E<T>::widen(x[i]), factor, negated(i));
  }
  // The codes of rows y[0..4) (values i..i + 3).
  template <int bits>
  static JAXHC_ROT_INLINE void store_codes(const V* y, const int32_t* thr, uint8_t* codes,
                                           uint32_t i) {
    int c[4];
    for (int k = 0; k < 4; k++) c[k] = code_of(y[k], thr, bits);
    if (bits == 8) {
      for (int k = 0; k < 4; k++) codes[i + k] = static_cast<uint8_t>(c[k]);
    } else {
      codes[i / 2] = static_cast<uint8_t>(c[0] | c[1] << 4);
      codes[i / 2 + 1] = static_cast<uint8_t>(c[2] | c[3] << 4);
    }
  }
  template <int bits>
  static JAXHC_ROT_INLINE V load_levels(const uint8_t* codes, uint32_t i) {
    const int c = bits == 8 ? codes[i] : (codes[i / 2] >> 4 * (i & 1)) & 0xf;
    return level_of(c, bits == 8 ? kLevels8 : kLevels4, bits);
  }
  // acc[i] (+)= the decoded value i rounded to T, for i < m.
  template <typename T>
  static JAXHC_ROT_INLINE void out(V v, float s, uint32_t i, uint64_t m, float* acc, bool add) {
    if (i >= m) return;
    const float w = E<T>::widen(E<T>::narrow(decoded(v, s, negated(i))));
    acc[i] = add ? acc[i] + w : w;
  }
};

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx2,f16c")

struct Avx2Team {
  using V = __m256i;
  struct D {
    __m256i even, odd;  // int64 sums of lanes 0, 2, 4, 6 and 1, 3, 5, 7
  };
  static constexpr int kLanes = 8, kGroup = 8;

  static V add(V a, V b) { return _mm256_add_epi32(a, b); }
  static V sub(V a, V b) { return _mm256_sub_epi32(a, b); }
  // partner + (v, negated where bit h of the lane is set)
  static V lane_butterfly(V v, int h) {
    if (h == 1)
      return add(_mm256_shuffle_epi32(v, 0xb1), _mm256_sign_epi32(v, _mm256_setr_epi32(1, -1, 1, -1, 1, -1, 1, -1)));
    if (h == 2)
      return add(_mm256_shuffle_epi32(v, 0x4e), _mm256_sign_epi32(v, _mm256_setr_epi32(1, 1, -1, -1, 1, 1, -1, -1)));
    return add(_mm256_permute2x128_si256(v, v, 1),
               _mm256_sign_epi32(v, _mm256_setr_epi32(1, 1, 1, 1, -1, -1, -1, -1)));
  }
  static D dzero() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
  // The squares as int64 (exact: below 2^41, their sums below 2^51), even and odd lanes.
  static D square_add(D d, V v) {
    const V odd = _mm256_srli_epi64(v, 32);
    return {_mm256_add_epi64(d.even, _mm256_mul_epi32(v, v)),
            _mm256_add_epi64(d.odd, _mm256_mul_epi32(odd, odd))};
  }
  static D dadd(D a, D b) {
    return {_mm256_add_epi64(a.even, b.even), _mm256_add_epi64(a.odd, b.odd)};
  }
  static double lane_total(D d) {
    alignas(32) int64_t s[4];
    _mm256_store_si256(reinterpret_cast<V*>(s), _mm256_add_epi64(d.even, d.odd));
    return static_cast<double>(s[0] + s[1] + s[2] + s[3]);
  }

  template <typename T>
  static uint32_t amax(const T* x, uint64_t m) {  // m: a multiple of 8
    __m256i a = _mm256_setzero_si256();
    for (uint64_t i = 0; i < m; i += 8)
      a = _mm256_max_epu32(a, _mm256_and_si256(_mm256_castps_si256(load8(x + i)),
                                               _mm256_set1_epi32(0x7fffffff)));
    __m128i h = _mm_max_epu32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4e));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xb1));
    return static_cast<uint32_t>(_mm_cvtsi128_si32(h));
  }
  template <typename T>
  static V load_fixed(const T* x, uint32_t i, float factor) {
    const __m256 v = load8(x + i);
    const V q = _mm256_cvtps_epi32(_mm256_mul_ps(v, _mm256_set1_ps(factor)));  // to nearest even
    return _mm256_sign_epi32(q, _mm256_load_si256(reinterpret_cast<const V*>(kTables.sign + i)));
  }
  // The codes of rows y[0..4) (values i..i + 31).
  template <int bits>
  static void store_codes(const V* y, const int32_t* thr, uint8_t* codes, uint32_t i) {
    const V c01 = _mm256_packus_epi32(codes8<bits>(y[0], thr), codes8<bits>(y[1], thr));
    const V c23 = _mm256_packus_epi32(codes8<bits>(y[2], thr), codes8<bits>(y[3], thr));
    const V b = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(c01, c23),
                                            _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));  // in order
    if constexpr (bits == 8) {
      _mm256_storeu_si256(reinterpret_cast<V*>(codes + i), b);
    } else {  // byte pairs (lo, hi) -> lo | hi << 4
      const V w = _mm256_or_si256(_mm256_and_si256(b, _mm256_set1_epi16(0x000f)),
                                  _mm256_and_si256(_mm256_srli_epi16(b, 4), _mm256_set1_epi16(0x00f0)));
      const __m128i p = _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i / 2), p);
    }
  }
  // The 8 codes of row y, as int32.
  template <int bits>
  static V codes8(V y, const int32_t* thr) {
    constexpr int half = 1 << (bits - 1);
    const V a = _mm256_abs_epi32(y);
    V k = _mm256_setzero_si256();
    if constexpr (bits == 4) {  // core's binary search, the 8 thresholds in a register
      const V t0 = _mm256_load_si256(reinterpret_cast<const V*>(thr));
      const V t1 = _mm256_loadu_si256(reinterpret_cast<const V*>(thr + 1));  // thr[8]: padding
      k = _mm256_and_si256(_mm256_cmpgt_epi32(a, _mm256_set1_epi32(thr[3])), _mm256_set1_epi32(4));
      k = _mm256_add_epi32(k, _mm256_and_si256(_mm256_cmpgt_epi32(a, _mm256_permutevar8x32_epi32(t1, k)),
                                               _mm256_set1_epi32(2)));
      k = _mm256_sub_epi32(k, _mm256_cmpgt_epi32(a, _mm256_permutevar8x32_epi32(t0, k)));
    } else {  // core's binary search, the thresholds gathered
      for (int step = half / 2; step; step >>= 1) {
        const V t = _mm256_i32gather_epi32(thr, _mm256_add_epi32(k, _mm256_set1_epi32(step - 1)), 4);
        k = _mm256_add_epi32(k, _mm256_and_si256(_mm256_cmpgt_epi32(a, t), _mm256_set1_epi32(step)));
      }
    }
    const V neg = _mm256_srai_epi32(y, 31);
    return _mm256_xor_si256(_mm256_add_epi32(k, _mm256_set1_epi32(half)),
                            _mm256_and_si256(neg, _mm256_set1_epi32(2 * half - 1)));
  }
  template <int bits>
  static V load_levels(const uint8_t* codes, uint32_t i) {
    if constexpr (bits == 8) {
      const V c = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i)));
      return _mm256_i32gather_epi32(kTables.level8, c, 4);
    } else {
      uint32_t four;
      std::memcpy(&four, codes + i / 2, 4);
      const V c = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(four)),
                                    _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
      const V* tab = reinterpret_cast<const V*>(kTables.level4);
      const V lo = _mm256_permutevar8x32_epi32(_mm256_load_si256(tab), c);  // low 3 bits
      const V hi = _mm256_permutevar8x32_epi32(_mm256_load_si256(tab + 1), c);
      const __m256 pick = _mm256_castsi256_ps(_mm256_slli_epi32(c, 28));  // bit 3 of the code
      return _mm256_castps_si256(
          _mm256_blendv_ps(_mm256_castsi256_ps(lo), _mm256_castsi256_ps(hi), pick));
    }
  }
  template <typename T>
  static void out(V v, float s, uint32_t i, uint64_t m, float* acc, bool add) {
    if (i >= m) return;
    const __m256 sign = _mm256_load_ps(reinterpret_cast<const float*>(kTables.sign_bit + i));
    __m256 w = _mm256_xor_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(v), _mm256_set1_ps(s)), sign);
    w = round8(w, static_cast<T*>(nullptr));
    if (i + 8 <= m) {
      _mm256_storeu_ps(acc + i, add ? _mm256_add_ps(_mm256_loadu_ps(acc + i), w) : w);
      return;
    }
    alignas(32) float tail[8];
    _mm256_store_ps(tail, w);
    for (uint32_t j = 0; i + j < m; j++) acc[i + j] = add ? acc[i + j] + tail[j] : tail[j];
  }
};

#pragma GCC pop_options
#endif

}  // namespace
}  // namespace quant
}  // namespace jaxhc

#include "cpu/quant_rotated_avx512.h"  // Avx512Team, on the tables above

namespace jaxhc {
namespace quant {
namespace {

// --- one block, any team -------------------------------------------------------------------------

// Encodes the block x[0..B) into *scale and B * bits / 8 code bytes; false: not ok.
template <class Tm, typename T, int B, int bits>
JAXHC_ROT_INLINE bool encode_block(const T* x, float* scale, uint8_t* codes) {
  constexpr int R = B / Tm::kLanes;
  const uint32_t a = Tm::template amax<T>(x, B);
  if (a >= kHugeBits || a < kTinyRotBits) {  // not ok, or (nearly) all zeros
    *scale = 0.0f;
    std::memset(codes, 0, B * bits / 8);
    return a < kHugeBits;
  }
  const float factor = fixed_factor(a);
  typename Tm::V v[R];
  for (int r = 0; r < R; r++) v[r] = Tm::template load_fixed<T>(x, r * Tm::kLanes, factor);
  const double sigma = sqrt_rn(sum_squares<Tm, R>(v));
  fwht<Tm, R>(v);
  *scale = block_scale(sigma, log2_of(B), a);
  alignas(32) int32_t thr[128];
  fixed_thresholds(thresholds_of(bits), bits, sigma, thr);
  for (int r = 0; r < R; r += 4) Tm::template store_codes<bits>(v + r, thr, codes, r * Tm::kLanes);
  return true;
}

// acc[0..m) (+)= the decoded values of one block, each rounded to T.
template <class Tm, typename T, int B, int bits>
JAXHC_ROT_INLINE void decode_block(const uint8_t* codes, float s, uint64_t m, float* acc,
                                   bool add) {
  constexpr int R = B / Tm::kLanes;
  if (!valid_scale(s)) {
    for (uint64_t i = 0; i < m; i++) acc[i] = add ? acc[i] + 0.0f : 0.0f;
    return;
  }
  typename Tm::V v[R];
  for (int r = 0; r < R; r++) v[r] = Tm::template load_levels<bits>(codes, r * Tm::kLanes);
  fwht<Tm, R>(v);
  for (int r = 0; r < R; r++) Tm::template out<T>(v[r], s, r * Tm::kLanes, m, acc, add);
}

// y = H x on one block of int32 values.
template <class Tm, int B>
JAXHC_ROT_INLINE void hadamard_block(const int32_t* x, int32_t* y) {
  constexpr int R = B / Tm::kLanes;
  typename Tm::V v[R];
  std::memcpy(v, x, sizeof v);
  fwht<Tm, R>(v);
  std::memcpy(y, v, sizeof v);
}

// The block functions of one team, under its instruction set.
#define JAXHC_ROT_BLOCKS(NAME, TEAM, ATTR)                                                 \
  struct NAME {                                                                            \
    template <typename T, int B, int bits>                                                 \
    ATTR static bool encode(const T* x, float* s, uint8_t* c) {                            \
      return encode_block<TEAM, T, B, bits>(x, s, c);                                      \
    }                                                                                      \
    template <typename T, int B, int bits>                                                 \
    ATTR static void decode(const uint8_t* c, float s, uint64_t m, float* acc, bool add) { \
      decode_block<TEAM, T, B, bits>(c, s, m, acc, add);                                   \
    }                                                                                      \
    template <int B>                                                                       \
    ATTR static void hadamard(const int32_t* x, int32_t* y) {                              \
      hadamard_block<TEAM, B>(x, y);                                                       \
    }                                                                                      \
  };

JAXHC_ROT_BLOCKS(ScalarBlocks, CpuScalar, )
#if defined(__x86_64__)
JAXHC_ROT_BLOCKS(Avx2Blocks, Avx2Team, __attribute__((target("avx2,f16c"))))
JAXHC_ROT_BLOCKS(Avx512Blocks, Avx512Team, JAXHC_QUANT_AVX512)
#endif

template <typename Fn>
void with_bits(int bits, Fn&& fn) {
  if (bits == 8) return fn(IntTag<8>{});
  fn(IntTag<4>{});
}

template <typename T, typename K, int B, int bits>
void encode_rows_t(const T* x, uint64_t rows, const Row& r, uint8_t* payload, bool* ok) {
  prefer_huge_pages(payload, rows * r.bytes);
  for (uint64_t i = 0; i < rows; i++) ok[i] = true;
  for_blocks(rows, r, [&](uint64_t row, uint64_t kb) {
    uint8_t* p = payload + row * r.bytes;
    float* scales = reinterpret_cast<float*>(p);
    const T* xb = x + row * r.n + kb * B;
    uint8_t* codes = r.codes(p) + r.code_offset(kb);
    const uint64_t m = r.size(kb);
    bool ok_block;
    if (m == B) {
      ok_block = K::template encode<T, B, bits>(xb, scales + kb, codes);
    } else {  // the row's last block, padded with zeros as the format codes it
      alignas(64) T pad[B];
      std::memset(static_cast<void*>(pad), 0, sizeof pad);
      std::memcpy(static_cast<void*>(pad), xb, m * sizeof(T));
      ok_block = K::template encode<T, B, bits>(pad, scales + kb, codes);
    }
    if (!ok_block) __atomic_store_n(&ok[row], false, __ATOMIC_RELAXED);
    if (kb + 1 == r.blocks) std::memset(p + r.used(true), 0, r.bytes - r.used(true));
  });
}

template <typename T, typename K, int B, int bits>
void decode_sum_rows_t(const uint8_t* payload, int parts, uint64_t rows, const Row& r, T* x) {
  prefer_huge_pages(x, rows * r.n * sizeof(T));
  for_blocks(rows, r, [&](uint64_t row, uint64_t kb) {
    alignas(32) float acc[B];
    const uint64_t m = r.size(kb);
    if constexpr (std::is_same_v<T, float>) {
      if (parts == 1) {  // a plain decode: straight into the output
        const uint8_t* p = payload + row * r.bytes;
        const float s = reinterpret_cast<const float*>(p)[kb];
        K::template decode<T, B, bits>(r.codes(p) + r.code_offset(kb), s, m, x + row * r.n + kb * B,
                                       false);
        return;
      }
    }
    for (int part = 0; part < parts; part++) {
      const uint8_t* p = payload + (row * parts + part) * r.bytes;
      const float s = reinterpret_cast<const float*>(p)[kb];
      K::template decode<T, B, bits>(r.codes(p) + r.code_offset(kb), s, m, acc, part > 0);
    }
    T* out = x + row * r.n + kb * B;
    if constexpr (std::is_same_v<T, float>) {
      std::memcpy(out, acc, m * sizeof(float));
    } else {
      uint64_t i = 0;
#if defined(__x86_64__)
      if constexpr (!std::is_same_v<K, ScalarBlocks>) i = narrow_avx2(acc, m, out);
#endif
      for (; i < m; i++) out[i] = E<T>::narrow(acc[i]);
    }
  });
}

// Calls fn(T{}, IntTag<block>, IntTag<bits>).
template <typename Fn>
void dispatch(Elem type, uint64_t block, int bits, Fn&& fn) {
  with_elem(type, [&](auto t) {
    with_block(block, [&](auto b) { with_bits(bits, [&](auto q) { fn(t, b, q); }); });
  });
}

// The rows of quant_kernels.h on the block functions K.
template <class K>
void encode_rows_k(const void* x, Elem type, uint64_t rows, uint64_t n, int bits, uint64_t block,
                   uint8_t* payload, bool* ok) {
  const Row r(n, bits, block, true);
  dispatch(type, block, bits, [&](auto t, auto b, auto q) {
    using T = decltype(t);
    encode_rows_t<T, K, decltype(b)::value, decltype(q)::value>(static_cast<const T*>(x), rows, r,
                                                                payload, ok);
  });
}

template <class K>
void decode_sum_rows_k(const uint8_t* payload, int parts, Elem type, uint64_t rows, uint64_t n,
                       int bits, uint64_t block, void* x) {
  const Row r(n, bits, block, true);
  dispatch(type, block, bits, [&](auto t, auto b, auto q) {
    using T = decltype(t);
    decode_sum_rows_t<T, K, decltype(b)::value, decltype(q)::value>(payload, parts, rows, r,
                                                                    static_cast<T*>(x));
  });
}

template <class K>
void hadamard_rows_k(const int32_t* x, uint64_t n, uint64_t block, int32_t* y) {
  with_block(block, [&](auto b) {
    for (uint64_t i = 0; i < n; i += block) K::template hadamard<decltype(b)::value>(x + i, y + i);
  });
}

}  // namespace

// One kernel's rotated rows (quant_kernels.h's functions less the kernel argument).
struct RotatedRows {
  void (*encode)(const void* x, Elem type, uint64_t rows, uint64_t n, int bits, uint64_t block,
                 uint8_t* payload, bool* ok);
  void (*decode_sum)(const uint8_t* payload, int parts, Elem type, uint64_t rows, uint64_t n,
                     int bits, uint64_t block, void* x);
  void (*hadamard)(const int32_t* x, uint64_t n, uint64_t block, int32_t* y);
};

// Defines RotatedRows FN() on the block functions BLOCKS (one translation unit per kernel).
#define JAXHC_ROT_KERNEL(FN, BLOCKS) \
  RotatedRows FN() { return {encode_rows_k<BLOCKS>, decode_sum_rows_k<BLOCKS>, hadamard_rows_k<BLOCKS>}; }

RotatedRows rotated_portable();
#if defined(__x86_64__)
RotatedRows rotated_avx2();
RotatedRows rotated_avx512();
#endif

}  // namespace quant
}  // namespace jaxhc
