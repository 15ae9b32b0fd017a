// The AVX-512 team of the rotated block quantizers (the avx512 kernel of cpu/quant_rotated_teams.h,
// which includes this file after its tables kTables): 16 int32 lanes a row and
// 16 rows transformed at once in the 32 registers (a block of 256 values). Same integer transform
// and the same codes as the other teams, so the same bytes. 4-bit codes: a binary search over the
// 8 thresholds in one register (vpermd), levels by one vpermd over the 16 signed levels, the
// nibbles put in order by one vpermb (AVX-512 VBMI). Compiled with the target attribute, chosen
// at run time (avx512_supported).
#pragma once

#if defined(__x86_64__)
namespace jaxhc {
namespace quant {
namespace {

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512vbmi,avx2,f16c")

// 16 values from p, widened to float32 exactly.
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const Bf16* p) {
  const __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
}
inline __m512 load16(const F16* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
// float32 values rounded to T as E<T>::narrow does (finite inputs), as float32.
inline __m512 round16(__m512 v, float*) { return v; }
inline __m512 round16(__m512 v, Bf16*) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_srli_epi32(r, 16), 16));
}
inline __m512 round16(__m512 v, F16*) {
  return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// Byte orders of vpermb: 4 rows' codes, byte k of int32 lane j (row k, value 16 k + j), to value
// order (8 bits), or their nibble pairs, byte k of int64 lane p (values 16 k + 2 p, + 1), to
// value order (4 bits: 32 bytes).
struct Avx512Orders {
  uint8_t codes8[64], codes4[64];
  constexpr Avx512Orders() : codes8(), codes4() {
    for (int k = 0; k < 4; k++)
      for (int j = 0; j < 16; j++) codes8[16 * k + j] = static_cast<uint8_t>(4 * j + k);
    for (int k = 0; k < 4; k++)
      for (int p = 0; p < 8; p++) codes4[8 * k + p] = static_cast<uint8_t>(8 * p + k);
  }
};
alignas(64) constexpr Avx512Orders kAvx512Orders{};

struct Avx512Team {
  using V = __m512i;
  struct D {
    __m512i even, odd;  // int64 sums of the even and the odd lanes
  };
  static constexpr int kLanes = 16, kGroup = 16;

  static V add(V a, V b) { return _mm512_add_epi32(a, b); }
  static V sub(V a, V b) { return _mm512_sub_epi32(a, b); }
  // partner + v where bit h of the lane is clear, partner - v where it is set
  static V lane_butterfly(V v, int h) {
    V p;
    __mmask16 set;
    if (h == 1) {
      p = _mm512_shuffle_epi32(v, _MM_PERM_CDAB);
      set = 0xaaaa;
    } else if (h == 2) {
      p = _mm512_shuffle_epi32(v, _MM_PERM_BADC);
      set = 0xcccc;
    } else if (h == 4) {
      p = _mm512_shuffle_i32x4(v, v, 0xb1);
      set = 0xf0f0;
    } else {
      p = _mm512_shuffle_i32x4(v, v, 0x4e);
      set = 0xff00;
    }
    return _mm512_mask_sub_epi32(_mm512_add_epi32(p, v), set, p, v);
  }
  static D dzero() { return {_mm512_setzero_si512(), _mm512_setzero_si512()}; }
  // The squares as int64 (exact: below 2^41, their sums below 2^51), even and odd lanes.
  static D square_add(D d, V v) {
    const V odd = _mm512_srli_epi64(v, 32);
    return {_mm512_add_epi64(d.even, _mm512_mul_epi32(v, v)),
            _mm512_add_epi64(d.odd, _mm512_mul_epi32(odd, odd))};
  }
  static D dadd(D a, D b) {
    return {_mm512_add_epi64(a.even, b.even), _mm512_add_epi64(a.odd, b.odd)};
  }
  static double lane_total(D d) {
    __m512i t = _mm512_add_epi64(d.even, d.odd);  // folded by halves (no reduce intrinsics:
    t = _mm512_add_epi64(t, _mm512_shuffle_i32x4(t, t, 0x4e));  // GCC 12 warns on them)
    t = _mm512_add_epi64(t, _mm512_shuffle_i32x4(t, t, 0xb1));
    const __m128i h = _mm512_castsi512_si128(t);
    return static_cast<double>(_mm_cvtsi128_si64(_mm_add_epi64(h, _mm_unpackhi_epi64(h, h))));
  }

  template <typename T>
  static uint32_t amax(const T* x, uint64_t m) {  // m: a multiple of 16
    __m512i a = _mm512_setzero_si512();
    for (uint64_t i = 0; i < m; i += 16)
      a = _mm512_max_epu32(a, _mm512_and_si512(_mm512_castps_si512(load16(x + i)),
                                               _mm512_set1_epi32(0x7fffffff)));
    a = _mm512_max_epu32(a, _mm512_shuffle_i32x4(a, a, 0x4e));
    a = _mm512_max_epu32(a, _mm512_shuffle_i32x4(a, a, 0xb1));
    __m128i h = _mm512_castsi512_si128(a);
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4e));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xb1));
    return static_cast<uint32_t>(_mm_cvtsi128_si32(h));
  }
  // Rounding to nearest even commutes with negation, so the sign goes on before the conversion.
  template <typename T>
  static V load_fixed(const T* x, uint32_t i, float factor) {
    const __m512 v = load16(x + i);
    const __m512 sign = _mm512_load_ps(reinterpret_cast<const float*>(kTables.sign_bit + i));
    return _mm512_cvtps_epi32(_mm512_xor_ps(_mm512_mul_ps(v, _mm512_set1_ps(factor)), sign));
  }
  // The codes of rows y[0..4) (values i..i + 63).
  template <int bits>
  static void store_codes(const V* y, const int32_t* thr, uint8_t* codes, uint32_t i) {
    V w = codes16<bits>(y[0], thr);  // byte k of lane j: the code of row k, lane j
    w = _mm512_or_si512(w, _mm512_slli_epi32(codes16<bits>(y[1], thr), 8));
    w = _mm512_or_si512(w, _mm512_slli_epi32(codes16<bits>(y[2], thr), 16));
    w = _mm512_or_si512(w, _mm512_slli_epi32(codes16<bits>(y[3], thr), 24));
    if constexpr (bits == 8) {
      const V order = _mm512_load_si512(kAvx512Orders.codes8);
      _mm512_storeu_si512(codes + i, _mm512_permutexvar_epi8(order, w));
    } else {  // the odd lane's codes as high nibbles of the even lane's bytes
      const V pairs = _mm512_or_si512(w, _mm512_srli_epi64(w, 28));
      const V order = _mm512_load_si512(kAvx512Orders.codes4);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + i / 2),
                          _mm512_castsi512_si256(_mm512_permutexvar_epi8(order, pairs)));
    }
  }
  // The 16 codes of row y, as int32.
  template <int bits>
  static V codes16(V y, const int32_t* thr) {
    constexpr int half = 1 << (bits - 1);
    const V a = _mm512_abs_epi32(y);
    V k = _mm512_setzero_si512();
    if constexpr (bits == 4) {  // core's binary search, the 8 thresholds in a register
      const V t0 = _mm512_castsi256_si512(_mm256_load_si256(reinterpret_cast<const __m256i*>(thr)));
      const V t1 = _mm512_castsi256_si512(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(thr + 1)));  // thr[8]: padding
      k = _mm512_maskz_mov_epi32(_mm512_cmpgt_epi32_mask(a, _mm512_set1_epi32(thr[3])),
                                 _mm512_set1_epi32(4));
      k = _mm512_mask_add_epi32(k, _mm512_cmpgt_epi32_mask(a, _mm512_permutexvar_epi32(k, t1)), k,
                                _mm512_set1_epi32(2));
      k = _mm512_mask_add_epi32(k, _mm512_cmpgt_epi32_mask(a, _mm512_permutexvar_epi32(k, t0)), k,
                                _mm512_set1_epi32(1));
    } else {  // core's binary search, the thresholds gathered
      for (int step = half / 2; step; step >>= 1) {
        const V t = _mm512_i32gather_epi32(_mm512_add_epi32(k, _mm512_set1_epi32(step - 1)), thr, 4);
        k = _mm512_mask_add_epi32(k, _mm512_cmpgt_epi32_mask(a, t), k, _mm512_set1_epi32(step));
      }
    }
    const V c = _mm512_add_epi32(k, _mm512_set1_epi32(half));
    return _mm512_mask_xor_epi32(c, _mm512_movepi32_mask(y), c, _mm512_set1_epi32(2 * half - 1));
  }
  template <int bits>
  static V load_levels(const uint8_t* codes, uint32_t i) {
    if constexpr (bits == 8) {
      const V c = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i)));
      return _mm512_i32gather_epi32(c, kTables.level8, 4);
    } else {  // bytes (b_j, b_j >> 4 | b_(j+1) << 4): the nibbles in the low 4 bits, in order
      const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i / 2));
      const V c = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(b, _mm_srli_epi16(b, 4)));
      return _mm512_permutexvar_epi32(c, _mm512_load_si512(kTables.level4));  // low 4 bits
    }
  }
  template <typename T>
  static void out(V v, float s, uint32_t i, uint64_t m, float* acc, bool add) {
    if (i >= m) return;
    const __m512 sign = _mm512_load_ps(reinterpret_cast<const float*>(kTables.sign_bit + i));
    __m512 w = _mm512_xor_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(v), _mm512_set1_ps(s)), sign);
    w = round16(w, static_cast<T*>(nullptr));
    if (i + 16 <= m) {
      _mm512_storeu_ps(acc + i, add ? _mm512_add_ps(_mm512_loadu_ps(acc + i), w) : w);
      return;
    }
    alignas(64) float tail[16];
    _mm512_store_ps(tail, w);
    for (uint32_t j = 0; i + j < m; j++) acc[i + j] = add ? acc[i + j] + tail[j] : tail[j];
  }
};

#pragma GCC pop_options

}  // namespace
}  // namespace quant
}  // namespace jaxhc
#endif
