// AVX-512 lane types of the lane-parallel ZFP coder (core/zfp_lanes.h), compiled for that
// instruction set only (pragma target; the module stays baseline x86-64 and cpu/zfp_kernels.cc
// picks a kernel at run time). Avx512 codes 16 blocks a vector (VBMI byte permutes for the plane
// tables, GFNI 8x8 bit transposes for the bit planes), and a group is two of them (lanes::Pair)
// whose planes are decoded in 16-bit lanes (Avx512Words: all 32 blocks in one vector). Besides
// the coder's operations the type moves a group's values between memory and lanes (load*/store*:
// value i of block j to lane j of f[i], widening bfloat16/float16 and narrowing float16 as
// jnp.astype does; store_high_halves: the high 16 bits of each lane, a bfloat16 once rounded by
// round_bf16) and its stream words (words32 for maxbits 32, words64 for maxbits 64).
#pragma once
#if defined(__x86_64__)
// GCC 12 warns about _mm512_undefined_epi32 inside its own intrinsics (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>

#include "core/zfp_lanes.h"

namespace jaxhc {
namespace zfp {
namespace x86 {

using lanes::kLuts;

// Permute indices of the AVX-512 lanes (lane p of a group holds block p).
struct PlaneIdx {
  uint8_t gather[2][64];    // [jp] u0/u1 (or u2/u3) bytes 2jp, 2jp + 1 of each lane
  uint8_t matrix[2][64];    // [h] the 8 bytes of each of lanes 8h..8h+7, reversed for GFNI
  uint8_t unmatrix[2][64];  // [h] planes words back to the reversed rows of lanes 8h..
  uint8_t split[2][64];     // [s] coefficient bytes of t = 2s, 2s + 1 of every lane
  uint8_t join[2][64];      // [t & 1] coefficient t's 4 bytes
};
constexpr PlaneIdx plane_idx() {
  PlaneIdx x{};
  for (int p = 0; p < 16; p++) {
    int h = p >> 3, q = p & 7, o = 8 * q;
    for (int jp = 0; jp < 2; jp++) {
      const int g[4] = {4 * p + 2 * jp, 4 * p + 2 * jp + 1, 64 + 4 * p + 2 * jp,
                        64 + 4 * p + 2 * jp + 1};
      for (int c = 0; c < 4; c++) x.gather[jp][4 * p + c] = static_cast<uint8_t>(g[c]);
    }
    // row t of the matrix is coefficient t's byte 2jp (t < 4) or byte 2jp + 1 (t - 4); GFNI
    // wants row t in byte 7 - t. X01 holds u0 b, u0 b+1, u1 b, u1 b+1 per lane; X23 the same.
    const int m[8] = {64 + 4 * q + 3, 64 + 4 * q + 1, 4 * q + 3, 4 * q + 1,
                      64 + 4 * q + 2, 64 + 4 * q,     4 * q + 2, 4 * q};
    for (int c = 0; c < 8; c++) x.matrix[h][o + c] = static_cast<uint8_t>(m[c] + 32 * h);
    for (int c = 0; c < 4; c++) {
      x.unmatrix[h][o + c] = static_cast<uint8_t>(64 + 4 * p + 3 - c);
      x.unmatrix[h][o + 4 + c] = static_cast<uint8_t>(4 * p + 3 - c);
    }
    for (int s = 0; s < 2; s++) {
      int b = 64 * h + 8 * q;
      const int sp[4] = {b + 2 * s, b + 4 + 2 * s, b + 2 * s + 1, b + 4 + 2 * s + 1};
      for (int c = 0; c < 4; c++) x.split[s][4 * p + c] = static_cast<uint8_t>(sp[c]);
    }
    for (int tt = 0; tt < 2; tt++) {
      const int j[4] = {4 * p + 2 * tt, 4 * p + 2 * tt + 1, 64 + 4 * p + 2 * tt,
                        64 + 4 * p + 2 * tt + 1};
      for (int c = 0; c < 4; c++) x.join[tt][4 * p + c] = static_cast<uint8_t>(j[c]);
    }
  }
  return x;
}
inline constexpr PlaneIdx kPlaneIdx = plane_idx();

struct HalfIdx {
  uint16_t spread[4][32];  // [i]: word 2j + 1 <- half 4j + i (bfloat16 into the high word)
  uint16_t pair[2][32];    // [i >> 1]: words j, 16 + j <- halves 4j + i, 4j + i + 1
  uint16_t high[32];       // words j, 16 + j <- the high words of lane j of two vectors
  uint16_t blocks[2][32];  // [h]: word 4j + i of blocks 8h.. <- 16 i + (j + 8h) of two pairs
};
constexpr HalfIdx half_idx() {
  HalfIdx x{};
  for (int j = 0; j < 16; j++) {
    for (int i = 0; i < 4; i++) x.spread[i][2 * j + 1] = static_cast<uint16_t>(4 * j + i);
    for (int i = 0; i < 2; i++) {
      x.pair[i][j] = static_cast<uint16_t>(4 * j + 2 * i);
      x.pair[i][16 + j] = static_cast<uint16_t>(4 * j + 2 * i + 1);
    }
    x.high[j] = static_cast<uint16_t>(2 * j + 1);
    x.high[16 + j] = static_cast<uint16_t>(32 + 2 * j + 1);
  }
  for (int h = 0; h < 2; h++)
    for (int j = 0; j < 8; j++)
      for (int i = 0; i < 4; i++)
        x.blocks[h][4 * j + i] = static_cast<uint16_t>(16 * i + j + 8 * h);
  return x;
}
inline constexpr HalfIdx kHalfIdx = half_idx();

// Permute indices and tables of the 16-bit plane decoder (lane j of 32 in word j).
struct WordIdx {
  uint16_t low[32], high[32];  // the low / high 16 bits of 32 lanes' 32-bit words
  uint16_t join[2][32];        // [h] 32-bit words of lanes 16h.. from two word vectors
};
constexpr WordIdx word_idx() {
  WordIdx x{};
  for (int i = 0; i < 32; i++) {
    x.low[i] = static_cast<uint16_t>(2 * i);
    x.high[i] = static_cast<uint16_t>(2 * i + 1);
  }
  for (int h = 0; h < 2; h++)
    for (int i = 0; i < 16; i++) {
      x.join[h][2 * i] = static_cast<uint16_t>(16 * h + i);
      x.join[h][2 * i + 1] = static_cast<uint16_t>(32 + 16 * h + i);
    }
  return x;
}
inline constexpr WordIdx kWordIdx = word_idx();

#pragma GCC push_options
#pragma GCC target( \
    "avx512f,avx512bw,avx512dq,avx512vl,avx512vbmi,avx512vbmi2,gfni,avx2,f16c,fma,bmi,bmi2")

#define JAXHC_IDX16(...) _mm512_setr_epi32(__VA_ARGS__)

struct Avx512 : lanes::Planes32 {
  static constexpr int kLanes = 16;
  using V = __m512i;
  using M = __mmask16;

  static V set1(uint32_t v) { return _mm512_set1_epi32(static_cast<int>(v)); }
  static V add(V a, V b) { return _mm512_add_epi32(a, b); }
  static V sub(V a, V b) { return _mm512_sub_epi32(a, b); }
  static V and_(V a, V b) { return _mm512_and_si512(a, b); }
  static V or_(V a, V b) { return _mm512_or_si512(a, b); }
  static V xor_(V a, V b) { return _mm512_xor_si512(a, b); }
  static V or_and(V a, V b, V c) { return _mm512_ternarylogic_epi32(a, b, c, 0xf8); }
  template <int s>
  static V sll(V a) {
    return _mm512_slli_epi32(a, s);
  }
  template <int s>
  static V srl(V a) {
    return _mm512_srli_epi32(a, s);
  }
  template <int s>
  static V sra(V a) {
    return _mm512_srai_epi32(a, s);
  }
  static V sllv(V a, V n) { return _mm512_sllv_epi32(a, n); }
  static V srlv(V a, V n) { return _mm512_srlv_epi32(a, n); }
  static V max_u(V a, V b) { return _mm512_max_epu32(a, b); }
  static M lt_s(V a, V b) { return _mm512_cmplt_epi32_mask(a, b); }
  static M gt_s(V a, V b) { return _mm512_cmpgt_epi32_mask(a, b); }
  static M eq(V a, V b) { return _mm512_cmpeq_epi32_mask(a, b); }
  static M mand(M a, M b) { return static_cast<M>(a & b); }
  static bool any(M m) { return m != 0; }
  static V select(M m, V a, V b) { return _mm512_mask_blend_epi32(m, b, a); }
  static V zero_where(M m, V a) { return _mm512_maskz_mov_epi32(static_cast<M>(~m), a); }
  static V fadd(V a, V b) {
    return _mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(b)));
  }
  static V scale_trunc(V f, V s) {
    return _mm512_cvttps_epi32(_mm512_mul_ps(_mm512_castsi512_ps(f), _mm512_castsi512_ps(s)));
  }
  static V int_scale(V i, V s) {
    return _mm512_castps_si512(_mm512_mul_ps(_mm512_cvtepi32_ps(i), _mm512_castsi512_ps(s)));
  }

  // --- plane tables: byte permutes on the low byte of each lane --------------------------------
  static constexpr __mmask64 kLow = 0x1111111111111111ull;
  static V table(const uint8_t* t) { return _mm512_loadu_si512(t); }
  static void enc_lookup(V idx, V& bits, V& len, V& next) {
    bits = _mm512_maskz_permutexvar_epi8(kLow, idx, table(kLuts.enc_bits));
    len = _mm512_maskz_permutexvar_epi8(kLow, idx, table(kLuts.enc_len));
    next = _mm512_maskz_permutexvar_epi8(kLow, idx, table(kLuts.enc_next));
  }
  // --- bit planes: byte permutes around a GFNI 8x8 bit transpose ---------------------------------
  // gf2p8affine(kRows, m) gives, in each 64-bit word, byte b bit t = bit b of byte 7 - t of m.
  static V rows() { return _mm512_set1_epi64(0x8040201008040201ll); }
  static V perm8(V a, V idx, V b) { return _mm512_permutex2var_epi8(a, idx, b); }
  static V bytes(const uint8_t (&i)[64]) { return _mm512_loadu_si512(i); }

  static void planes(const V* u, V* p) {
    for (int jp = 0; jp < 2; jp++) {
      V g = bytes(kPlaneIdx.gather[jp]);
      V x01 = perm8(u[0], g, u[1]), x23 = perm8(u[2], g, u[3]);
      V r0 = _mm512_gf2p8affine_epi64_epi8(rows(), perm8(x01, bytes(kPlaneIdx.matrix[0]), x23), 0);
      V r1 = _mm512_gf2p8affine_epi64_epi8(rows(), perm8(x01, bytes(kPlaneIdx.matrix[1]), x23), 0);
      p[2 * jp] = _mm512_permutex2var_epi32(
          r0, JAXHC_IDX16(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30), r1);
      p[2 * jp + 1] = _mm512_permutex2var_epi32(
          r0, JAXHC_IDX16(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31), r1);
    }
  }

  static void unplanes(const V* p, V* u) {
    V y[2][2];
    for (int jp = 0; jp < 2; jp++) {
      V g0 = _mm512_gf2p8affine_epi64_epi8(
          rows(), perm8(p[2 * jp], bytes(kPlaneIdx.unmatrix[0]), p[2 * jp + 1]), 0);
      V g1 = _mm512_gf2p8affine_epi64_epi8(
          rows(), perm8(p[2 * jp], bytes(kPlaneIdx.unmatrix[1]), p[2 * jp + 1]), 0);
      for (int s = 0; s < 2; s++) y[jp][s] = perm8(g0, bytes(kPlaneIdx.split[s]), g1);
    }
    for (int t = 0; t < 4; t++)
      u[t] = perm8(y[0][t >> 1], bytes(kPlaneIdx.join[t & 1]), y[1][t >> 1]);
  }

  // --- values: 64 of them, block j's value i to lane j of f[i] ----------------------------------
  static void load(const float* x, V* f) {
    V l[4];
    for (int i = 0; i < 4; i++) l[i] = _mm512_loadu_si512(x + 16 * i);
    const V ia = JAXHC_IDX16(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
    const V ib = add(ia, set1(2));
    V a = _mm512_permutex2var_epi32(l[0], ia, l[1]), b = _mm512_permutex2var_epi32(l[0], ib, l[1]);
    V c = _mm512_permutex2var_epi32(l[2], ia, l[3]), d = _mm512_permutex2var_epi32(l[2], ib, l[3]);
    f[0] = _mm512_shuffle_i64x2(a, c, 0x44), f[1] = _mm512_shuffle_i64x2(a, c, 0xee);
    f[2] = _mm512_shuffle_i64x2(b, d, 0x44), f[3] = _mm512_shuffle_i64x2(b, d, 0xee);
  }
  static void store(const V* f, float* x) {
    V a = _mm512_shuffle_i64x2(f[0], f[1], 0x44), c = _mm512_shuffle_i64x2(f[0], f[1], 0xee);
    V b = _mm512_shuffle_i64x2(f[2], f[3], 0x44), d = _mm512_shuffle_i64x2(f[2], f[3], 0xee);
    const V lo = JAXHC_IDX16(0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27);
    const V hi = add(lo, set1(4));
    _mm512_storeu_si512(x, _mm512_permutex2var_epi32(a, lo, b));
    _mm512_storeu_si512(x + 16, _mm512_permutex2var_epi32(a, hi, b));
    _mm512_storeu_si512(x + 32, _mm512_permutex2var_epi32(c, lo, d));
    _mm512_storeu_si512(x + 48, _mm512_permutex2var_epi32(c, hi, d));
  }

  static V words(const uint16_t (&i)[32]) { return _mm512_loadu_si512(i); }

  static void load_bf16(const uint16_t* x, V* f) {
    V h0 = _mm512_loadu_si512(x), h1 = _mm512_loadu_si512(x + 32);
    for (int i = 0; i < 4; i++)
      f[i] = _mm512_maskz_permutex2var_epi16(0xaaaaaaaau, h0, words(kHalfIdx.spread[i]), h1);
  }
  static void load_f16(const uint16_t* x, V* f) {
    V h0 = _mm512_loadu_si512(x), h1 = _mm512_loadu_si512(x + 32);
    for (int i = 0; i < 2; i++) {
      V t = _mm512_permutex2var_epi16(h0, words(kHalfIdx.pair[i]), h1);
      f[2 * i] = _mm512_castps_si512(_mm512_cvtph_ps(_mm512_castsi512_si256(t)));
      f[2 * i + 1] = _mm512_castps_si512(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(t, 1)));
    }
  }
  // The high halves of h[i]'s lanes (one per lane) to 64 consecutive values.
  static void store_high_halves(const V* h, uint16_t* x) {
    V t01 = _mm512_permutex2var_epi16(h[0], words(kHalfIdx.high), h[1]);
    V t23 = _mm512_permutex2var_epi16(h[2], words(kHalfIdx.high), h[3]);
    _mm512_storeu_si512(x, _mm512_permutex2var_epi16(t01, words(kHalfIdx.blocks[0]), t23));
    _mm512_storeu_si512(x + 32, _mm512_permutex2var_epi16(t01, words(kHalfIdx.blocks[1]), t23));
  }
  // float32 bits rounded to bfloat16 (kept in the high half, low half zero) as jnp does.
  static V round_bf16(V u) {
    M nan = gt_s(and_(u, set1(0x7fffffff)), set1(0x7f800000));
    V r = add(add(u, set1(0x7fff)), and_(srl<16>(u), set1(1)));
    r = _mm512_mask_blend_epi32(nan, r, or_and(set1(0x7fc00000), u, set1(0x80000000)));
    return and_(r, set1(0xffff0000));
  }
  static V f16_bits(V u) {  // float16 bits in the high half of each lane
    return _mm512_slli_epi32(
        _mm512_cvtepu16_epi32(
            _mm512_cvtps_ph(_mm512_castsi512_ps(u), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)),
        16);
  }
  static V round_f16(V u) {
    return _mm512_castps_si512(_mm512_cvtph_ps(
        _mm512_cvtps_ph(_mm512_castsi512_ps(u), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
  }
  static void store_f16(const V* f, uint16_t* x) {
    V h[4];
    for (int i = 0; i < 4; i++) h[i] = f16_bits(f[i]);
    store_high_halves(h, x);
  }

  // --- stream words ------------------------------------------------------------------------------
  static V load_words32(const uint32_t* w) { return _mm512_loadu_si512(w); }
  static void store_words32(V a, uint32_t* w) { _mm512_storeu_si512(w, a); }
  static void load_words64(const uint64_t* w, V* a) {
    V q0 = _mm512_loadu_si512(w), q1 = _mm512_loadu_si512(w + 8);
    a[0] = _mm512_permutex2var_epi32(
        q0, JAXHC_IDX16(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30), q1);
    a[1] = _mm512_permutex2var_epi32(
        q0, JAXHC_IDX16(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31), q1);
  }
  static void store_words64(const V* a, uint64_t* w) {
    _mm512_storeu_si512(
        w, _mm512_permutex2var_epi32(
               a[0], JAXHC_IDX16(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23), a[1]));
    _mm512_storeu_si512(
        w + 8,
        _mm512_permutex2var_epi32(
            a[0], JAXHC_IDX16(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31), a[1]));
  }
};

// The plane decoder of a Pair<Avx512> group (32 blocks) in 16-bit lanes: one vector holds the
// state of all 32 blocks, so each step of a plane is one instruction, not one per half.
struct Avx512Words : lanes::Planes16 {
  static constexpr int kLanes = 32;
  using V = __m512i;
  using M = __mmask32;
  using Wide = lanes::Pair<Avx512>;

  static V set1(uint32_t v) { return _mm512_set1_epi16(static_cast<short>(v)); }
  static V add(V a, V b) { return _mm512_add_epi16(a, b); }
  static V sub(V a, V b) { return _mm512_sub_epi16(a, b); }
  static V and_(V a, V b) { return _mm512_and_si512(a, b); }
  static V xor_(V a, V b) { return _mm512_xor_si512(a, b); }
  static V or_and(V a, V b, V c) { return _mm512_ternarylogic_epi32(a, b, c, 0xf8); }
  static V or_andn(V a, V b, V c) { return _mm512_ternarylogic_epi32(a, b, c, 0xf4); }
  template <int s>
  static V sll(V a) {
    return _mm512_slli_epi16(a, s);
  }
  template <int s>
  static V srl(V a) {
    return _mm512_srli_epi16(a, s);
  }
  static V sllv(V a, V n) { return _mm512_sllv_epi16(a, n); }
  static V srlv(V a, V n) { return _mm512_srlv_epi16(a, n); }
  static V shrdv(V lo, V hi, V n) { return _mm512_shrdv_epi16(lo, hi, n); }
  static M lt_s(V a, V b) { return _mm512_cmplt_epi16_mask(a, b); }
  static M gt_s(V a, V b) { return _mm512_cmpgt_epi16_mask(a, b); }
  static M eq(V a, V b) { return _mm512_cmpeq_epi16_mask(a, b); }
  static M mand(M a, M b) { return static_cast<M>(a & b); }
  static bool any(M m) { return m != 0; }
  static V select(M m, V a, V b) { return _mm512_mask_blend_epi16(m, b, a); }
  static V or_(V a, V b) { return _mm512_or_si512(a, b); }
  static V add_where(M m, V a, V b) { return _mm512_mask_add_epi16(a, m, a, b); }
  static M test_where(M m, V a, V b) { return _mm512_mask_test_epi16_mask(m, a, b); }
  static V lookup4(V i, int v0, int v1, int v2, int v3) {
    auto two = [](int lo, int hi) { return static_cast<int>((lo & 0xffff) | (hi & 0xffff) << 16); };
    return _mm512_permutexvar_epi16(
        i, _mm512_setr_epi32(two(v0, v1), two(v2, v3), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0));
  }

  static V table(const void* t) { return _mm512_loadu_si512(t); }
  static V lookup256(V idx, M upper, const uint8_t* t) {  // idx's low byte into 256 entries
    constexpr __mmask64 kLow = 0x5555555555555555ull;     // the low byte of each lane
    V lo = _mm512_maskz_permutex2var_epi8(kLow, table(t), idx, table(t + 64));
    V hi = _mm512_maskz_permutex2var_epi8(kLow, table(t + 128), idx, table(t + 192));
    return _mm512_mask_blend_epi16(upper, lo, hi);
  }
  // A plane's steps are a chain through the state and the stream bits (the lookup's latency is
  // most of a step), kept short: the next state has its own table, the table half comes from the
  // state alone (bit 7 of the index is bit 6 of st), and shrdv takes e itself as its count.
  static V dec_lookup(V idx, V st, V& e, V& len) {
    M upper = _mm512_test_epi16_mask(st, set1(0x40));
    e = lookup256(idx, upper, kLuts.dec_lenx);
    len = and_(e, set1(15));
    return lookup256(idx, upper, kLuts.dec_next);
  }
  static V funnel_count(V e, V) { return e; }  // vpshrdvw counts modulo 16

  template <int W>
  static void from_words(const Wide::V* in, V* a) {
    for (int j = 0; j < W; j++) {
      a[2 * j] = _mm512_permutex2var_epi16(in[j].lo, table(kWordIdx.low), in[j].hi);
      a[2 * j + 1] = _mm512_permutex2var_epi16(in[j].lo, table(kWordIdx.high), in[j].hi);
    }
  }
  static void unplanes(const V* p, Wide::V* u) {
    Avx512::V half[2][4], coef[2][4];
    for (int h = 0; h < 2; h++) {
      for (int w = 0; w < 4; w++)
        half[h][w] = _mm512_permutex2var_epi16(p[2 * w], table(kWordIdx.join[h]), p[2 * w + 1]);
      Avx512::unplanes(half[h], coef[h]);
    }
    for (int t = 0; t < 4; t++) u[t] = {coef[0][t], coef[1][t]};
  }
};

#undef JAXHC_IDX16
#pragma GCC pop_options

}  // namespace x86

template <>
struct lanes::PlaneLanes<lanes::Pair<x86::Avx512>> {
  using type = x86::Avx512Words;
};

}  // namespace zfp
}  // namespace jaxhc
#endif  // __x86_64__
