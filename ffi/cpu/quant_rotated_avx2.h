// The AVX2 team of the rotated block quantizers (the avx2 kernel of cpu/quant_rotated.cc, which
// includes this file after its tables kTables and amax_scalar): 8 int32 lanes a row, F16C for
// float16. Same integer transform and the same codes as the other teams, so the same bytes.
// Compiled with the target attribute, chosen at run time.
#pragma once

#if defined(__x86_64__)
namespace jaxhc {
namespace quant {
namespace {

#pragma GCC push_options
#pragma GCC target("avx2,f16c")

struct Avx2Team {
  using V = __m256i;
  using D = __m256i;  // int64 sums, even and odd lanes added together (the totals are exact)
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
  static D dzero() { return _mm256_setzero_si256(); }
  // The squares as int64 (exact: below 2^41, their sums below 2^51).
  static D square_add(D d, V v) { return product_add(d, v, v); }
  static D dadd(D a, D b) { return _mm256_add_epi64(a, b); }
  static double lane_total(D d) { return static_cast<double>(itotal(d)); }

  // The scale choice's operations (core's scale_sums).
  using I = D;
  static I izero() { return dzero(); }
  // i + a * b, lane by lane, as int64 (the even lanes' and the odd lanes' products added).
  static I product_add(I i, V a, V b) {
    const V even = _mm256_mul_epi32(a, b);
    const V odd = _mm256_mul_epi32(_mm256_srli_epi64(a, 32), _mm256_srli_epi64(b, 32));
    return _mm256_add_epi64(i, _mm256_add_epi64(even, odd));
  }
  static int64_t itotal(I d) {
    alignas(32) int64_t s[4];
    _mm256_store_si256(reinterpret_cast<V*>(s), d);
    return s[0] + s[1] + s[2] + s[3];
  }
  static V absolute(V v) { return _mm256_abs_epi32(v); }
  static V lookup8(V k, const int32_t* tab) {
    return _mm256_permutevar8x32_epi32(_mm256_load_si256(reinterpret_cast<const V*>(tab)), k);
  }
  static V plus_if(V k, V a, V b) { return _mm256_sub_epi32(k, _mm256_cmpgt_epi32(a, b)); }
  static V minus_if(V k, V a, V b) { return _mm256_add_epi32(k, _mm256_cmpgt_epi32(a, b)); }
  // core's binary search for k over thr[0..8), thr[8]: padding
  static V index4(V a, const int32_t* thr) {
    const V t0 = _mm256_load_si256(reinterpret_cast<const V*>(thr));
    const V t1 = _mm256_loadu_si256(reinterpret_cast<const V*>(thr + 1));
    V k = _mm256_and_si256(_mm256_cmpgt_epi32(a, _mm256_set1_epi32(thr[3])), _mm256_set1_epi32(4));
    const V above2 = _mm256_cmpgt_epi32(a, _mm256_permutevar8x32_epi32(t1, k));
    k = _mm256_add_epi32(k, _mm256_and_si256(above2, _mm256_set1_epi32(2)));
    return _mm256_sub_epi32(k, _mm256_cmpgt_epi32(a, _mm256_permutevar8x32_epi32(t0, k)));
  }

  template <typename T, bool kFull>
  static uint32_t amax(const T* x, uint64_t m) {
    if (!kFull) return amax_scalar(x, m);
    __m256i a = _mm256_setzero_si256();
    for (uint64_t i = 0; i < m; i += 8)
      a = _mm256_max_epu32(a, _mm256_and_si256(_mm256_castps_si256(load8(x + i)),
                                               _mm256_set1_epi32(0x7fffffff)));
    __m128i h = _mm_max_epu32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4e));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xb1));
    return static_cast<uint32_t>(_mm_cvtsi128_si32(h));
  }
  template <typename T, bool kFull>
  static V load_fixed(const T* x, uint32_t i, uint64_t m, float factor) {
    __m256 v;
    if (kFull || i + 8 <= m) {
      v = load8(x + i);
    } else {  // the block's last values and its padding
      alignas(32) float tail[8];
      for (uint32_t j = 0; j < 8; j++) tail[j] = i + j < m ? E<T>::widen(x[i + j]) : 0.0f;
      v = _mm256_load_ps(tail);
    }
    const V q = _mm256_cvtps_epi32(_mm256_mul_ps(v, _mm256_set1_ps(factor)));  // to nearest even
    return _mm256_sign_epi32(q, _mm256_load_si256(reinterpret_cast<const V*>(kTables.sign + i)));
  }
  // The codes of rows y[0..4) (values i..i + 31).
  template <int bits>
  static void store_codes(const V* y, const int32_t* thr, uint8_t* codes, uint32_t i) {
    store_rows<bits>(codes8<bits>(y[0], thr), codes8<bits>(y[1], thr), codes8<bits>(y[2], thr),
                     codes8<bits>(y[3], thr), codes, i);
  }
  // The 4-bit codes of rows y[0..4) from their indices under candidate c (idx[k][c]).
  static constexpr bool kIndexCodes = true;
  static void store_index_codes(const V* y, const V (*idx)[kScales], int c, uint8_t* codes,
                                uint32_t i) {
    store_rows<4>(signed_codes<4>(y[0], idx[0][c]), signed_codes<4>(y[1], idx[1][c]),
                  signed_codes<4>(y[2], idx[2][c]), signed_codes<4>(y[3], idx[3][c]), codes, i);
  }
  // Four rows of codes (int32 lanes) stored in value order.
  template <int bits>
  static void store_rows(V c0, V c1, V c2, V c3, uint8_t* codes, uint32_t i) {
    const V c01 = _mm256_packus_epi32(c0, c1);
    const V c23 = _mm256_packus_epi32(c2, c3);
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
    if constexpr (bits == 4) {
      k = index4(a, thr);
    } else {  // core's binary search, the thresholds gathered
      for (int step = half / 2; step; step >>= 1) {
        const V t = _mm256_i32gather_epi32(thr, _mm256_add_epi32(k, _mm256_set1_epi32(step - 1)), 4);
        k = _mm256_add_epi32(k, _mm256_and_si256(_mm256_cmpgt_epi32(a, t), _mm256_set1_epi32(step)));
      }
    }
    return signed_codes<bits>(y, k);
  }
  // core's signed_code, lane by lane: half + k, or half - 1 - k where y < 0.
  template <int bits>
  static V signed_codes(V y, V k) {
    constexpr int half = 1 << (bits - 1);
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

}  // namespace
}  // namespace quant
}  // namespace jaxhc
#endif
