// The AVX2 kernel's q4:h blocks (the format of core/quant_rotated.h; q8:h and the transform alone
// stay on Avx2Blocks, cpu/quant_rotated_teams.h). The same integer transform in another order,
// so the same bytes. A block is G groups of 8 rows of 8 values. Per group, in registers: the
// butterflies across its rows (core's row_stages), then its three lane stages as register
// exchanges, two instructions a row each instead of three: a stage pairs two rows, shuffles their
// halves (permute2x128, unpack 64-bit, shuffle 32-bit) so that each new row holds one butterfly
// input of both, and adds and subtracts; the pair's row bit, already transformed, moves into the
// lane. Across the groups: row t of every group stored together (v[t * G + g]), so that core's
// fwht (no lane stages) runs on 8 contiguous sequences of G rows. A group leaves the exchanges
// transposed:
//   encode: natural in, out register t, lane u = value t + 8 (2 (u & 1) + ((u >> 1) & 1)) + 32 (u >> 2)
//   decode: register t, lane u = value (t >> 1 & 1) + 2 (t & 1) + 4 (t >> 2 & 1) + 8 u in, natural out
// which the code bytes absorb: the encoder packs the nibbles of the transposed rows (shift, or,
// two packs and one byte shuffle per 64 codes), the decoder reads its 8 codes a row with a
// dword broadcast instead of a load. The output floats stay in value order.
#pragma once
#include "cpu/quant_rotated_teams.h"

#if defined(__x86_64__)
namespace jaxhc {
namespace quant {
namespace {

#pragma GCC push_options
#pragma GCC target("avx2,f16c")

// Avx2Team without lane stages: core's fwht on it does every butterfly across rows alone.
struct Avx2Rows : Avx2Team {
  static constexpr int kLanes = 1;
};

using V8 = __m256i;

// One exchange stage on the 8 rows a[0..8): pairs (t, t + S), halves from lo/hi shuffles.
template <int S, typename Lo, typename Hi>
JAXHC_ROT_INLINE void exchange(V8* a, Lo lo, Hi hi) {
  for (int t = 0; t < 8; t++) {
    if (t & S) continue;
    const V8 l = lo(a[t], a[t + S]), h = hi(a[t], a[t + S]);
    a[t] = _mm256_add_epi32(l, h);
    a[t + S] = _mm256_sub_epi32(l, h);
  }
}

// The lane stages (bits 2, 1, 0 of the value index) of a group whose row stages are done.
JAXHC_ROT_INLINE void lane_exchanges(V8* a) {
  exchange<4>(a, [](V8 x, V8 y) { return _mm256_permute2x128_si256(x, y, 0x20); },
              [](V8 x, V8 y) { return _mm256_permute2x128_si256(x, y, 0x31); });
  exchange<2>(a, [](V8 x, V8 y) { return _mm256_unpacklo_epi64(x, y); },
              [](V8 x, V8 y) { return _mm256_unpackhi_epi64(x, y); });
  auto ps = [](V8 v) { return _mm256_castsi256_ps(v); };
  exchange<1>(a, [&](V8 x, V8 y) { return _mm256_castps_si256(_mm256_shuffle_ps(ps(x), ps(y), 0x88)); },
              [&](V8 x, V8 y) { return _mm256_castps_si256(_mm256_shuffle_ps(ps(x), ps(y), 0xdd)); });
}

// The 8 codes of row y (core's code_of): k = how many of thr[0..7) lie below |y|, core's binary
// search without lane crossings: thr[3], then thr[1] or thr[5] (a blend), then thr[k] for
// k = 0, 2, 4, 6 (an in-lane permute of t0246 = thr[0, 2, 4, 6] twice); code = (k ^ sign) + 8.
struct Thresholds4 {
  V8 t1, t3, t5;
  __m256 t0246;
};
JAXHC_ROT_INLINE V8 code4(V8 y, const Thresholds4& t) {
  const V8 a = _mm256_abs_epi32(y);
  const V8 m1 = _mm256_cmpgt_epi32(a, t.t3);
  const V8 m2 = _mm256_cmpgt_epi32(a, _mm256_blendv_epi8(t.t1, t.t5, m1));
  const V8 j = _mm256_sub_epi32(_mm256_and_si256(m1, _mm256_set1_epi32(2)), m2);  // k / 2
  const V8 m3 = _mm256_cmpgt_epi32(a, _mm256_castps_si256(_mm256_permutevar_ps(t.t0246, j)));
  const V8 k = _mm256_sub_epi32(_mm256_add_epi32(j, j), m3);
  return _mm256_add_epi32(_mm256_xor_si256(k, _mm256_srai_epi32(y, 31)), _mm256_set1_epi32(8));
}

// Encodes the block x[0..B) into *scale and B / 2 code bytes; false: not ok (encode_block's rules).
template <typename T, int B>
JAXHC_ROT_INLINE bool encode4(const T* x, float* scale, uint8_t* codes) {
  constexpr int G = B / 64;  // groups of 8 rows
  // The next block's values, on their way while this one computes (past a row's end: harmless).
  for (int i = 0; i < B; i += 64 / static_cast<int>(sizeof(T)))
    _mm_prefetch(reinterpret_cast<const char*>(x + B + i), _MM_HINT_T0);
  const uint32_t am = Avx2Team::amax<T>(x, B);
  if (am >= kHugeBits || am < kTinyRotBits) {
    *scale = 0.0f;
    std::memset(codes, 0, B / 2);
    return am < kHugeBits;
  }
  const float factor = fixed_factor(am);
  alignas(32) V8 v[8 * G];  // group g's row t at v[t * G + g]
  Avx2Team::D sq0 = Avx2Team::dzero(), sq1 = Avx2Team::dzero();
  for (int g = 0; g < G; g++) {
    V8 a[8];
    for (int t = 0; t < 8; t++) a[t] = Avx2Team::load_fixed<T>(x, (g * 8 + t) * 8, factor);
    for (int t = 0; t < 8; t += 2) {
      sq0 = Avx2Team::square_add(sq0, a[t]);
      sq1 = Avx2Team::square_add(sq1, a[t + 1]);
    }
    row_stages<Avx2Team>(a, 8);
    lane_exchanges(a);
    for (int t = 0; t < 8; t++) v[t * G + g] = a[t];
  }
  for (int t = 0; t < 8; t++) fwht<Avx2Rows, G>(v + t * G);  // across the groups
  const double sigma = sqrt_rn(Avx2Team::lane_total(Avx2Team::dadd(sq0, sq1)));
  *scale = block_scale(sigma, log2_of(B), am);
  alignas(32) int32_t thr[8];
  fixed_thresholds(kThresholds4, 4, sigma, thr);
  const Thresholds4 th{_mm256_set1_epi32(thr[1]), _mm256_set1_epi32(thr[3]), _mm256_set1_epi32(thr[5]),
                       _mm256_castsi256_ps(_mm256_setr_epi32(thr[0], thr[2], thr[4], thr[6], thr[0],
                                                             thr[2], thr[4], thr[6]))};
  // byte m of a half <- byte 4 (m & 3) + (m >> 3 & 1) + 2 (m >> 2 & 1) of the packed rows
  const V8 order = _mm256_broadcastsi128_si256(
      _mm_setr_epi8(0, 4, 8, 12, 2, 6, 10, 14, 1, 5, 9, 13, 3, 7, 11, 15));
  for (int g = 0; g < G; g++) {
    V8 p[4];  // p[s] lane u: byte s + 4 (u >> 1 & 1) + 8 (u & 1) + 16 (u >> 2) of the group
    for (int s = 0; s < 4; s++)
      p[s] = _mm256_or_si256(code4(v[2 * s * G + g], th),
                             _mm256_slli_epi32(code4(v[(2 * s + 1) * G + g], th), 4));
    const V8 b = _mm256_packus_epi16(_mm256_packus_epi32(p[0], p[1]), _mm256_packus_epi32(p[2], p[3]));
    _mm256_storeu_si256(reinterpret_cast<V8*>(codes + g * 32), _mm256_shuffle_epi8(b, order));
  }
  return true;
}

// acc[0..m) (+)= the decoded values of one block, each rounded to T (decode_block's rules).
template <typename T, int B>
JAXHC_ROT_INLINE void decode4(const uint8_t* codes, float s, uint64_t m, float* acc, bool add) {
  constexpr int G = B / 64;  // groups of 8 rows
  if (!valid_scale(s)) {
    for (uint64_t i = 0; i < m; i++) acc[i] = add ? acc[i] + 0.0f : 0.0f;
    return;
  }
  const V8* tab = reinterpret_cast<const V8*>(kTables.level4);
  const V8 lo = _mm256_load_si256(tab), hi = _mm256_load_si256(tab + 1);
  // dword s of a half <- byte s of its dwords 0..3: the codes of values 2 s, 2 s + 1 (+ 8 u)
  const V8 order = _mm256_broadcastsi128_si256(
      _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
  const V8 shift = _mm256_setr_epi32(0, 8, 16, 24, 0, 8, 16, 24);
  const V8 shift4 = _mm256_add_epi32(shift, _mm256_set1_epi32(4));
  alignas(32) V8 v[8 * G];  // group g's row t at v[t * G + g]
  for (int g = 0; g < G; g++) {
    const V8 b = _mm256_shuffle_epi8(
        _mm256_loadu_si256(reinterpret_cast<const V8*>(codes + g * 32)), order);
    const V8 d[4] = {_mm256_shuffle_epi32(b, 0x00), _mm256_shuffle_epi32(b, 0x55),
                     _mm256_shuffle_epi32(b, 0xaa), _mm256_shuffle_epi32(b, 0xff)};
    V8 a[8];
    for (int t = 0; t < 8; t++) {  // row t: values (t >> 1 & 1) + 2 (t & 1) + 4 (t >> 2) + 8 u
      const V8 c = _mm256_srlv_epi32(d[(t & 1) + (t >> 2) * 2], (t & 2) ? shift4 : shift);
      const __m256 pick = _mm256_castsi256_ps(_mm256_slli_epi32(c, 28));  // bit 3 of the code
      a[t] = _mm256_castps_si256(
          _mm256_blendv_ps(_mm256_castsi256_ps(_mm256_permutevar8x32_epi32(lo, c)),
                           _mm256_castsi256_ps(_mm256_permutevar8x32_epi32(hi, c)), pick));
    }
    row_stages<Avx2Team>(a, 8);
    for (int t = 0; t < 8; t++) v[t * G + g] = a[t];
  }
  for (int t = 0; t < 8; t++) fwht<Avx2Rows, G>(v + t * G);  // across the groups
  for (int g = 0; g < G; g++) {
    V8 a[8];
    for (int t = 0; t < 8; t++) a[t] = v[t * G + g];
    lane_exchanges(a);
    for (int t = 0; t < 8; t++) Avx2Team::out<T>(a[t], s, (g * 8 + t) * 8, m, acc, add);
  }
}

#pragma GCC pop_options

// Avx2Blocks with q4:h's blocks above.
struct Avx2Q4Blocks {
  template <typename T, int B, int bits>
  __attribute__((target("avx2,f16c"))) static bool encode(const T* x, float* s, uint8_t* c) {
    if constexpr (bits == 4) {
      return encode4<T, B>(x, s, c);
    } else {
      return Avx2Blocks::encode<T, B, bits>(x, s, c);
    }
  }
  template <typename T, int B, int bits>
  __attribute__((target("avx2,f16c"))) static void decode(const uint8_t* c, float s, uint64_t m,
                                                          float* acc, bool add) {
    if constexpr (bits == 4) {
      decode4<T, B>(c, s, m, acc, add);
    } else {
      Avx2Blocks::decode<T, B, bits>(c, s, m, acc, add);
    }
  }
  template <int B>
  static void hadamard(const int32_t* x, int32_t* y) {
    Avx2Blocks::hadamard<B>(x, y);
  }
};

}  // namespace
}  // namespace quant
}  // namespace jaxhc
#endif  // __x86_64__
