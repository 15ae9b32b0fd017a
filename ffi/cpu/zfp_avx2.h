// The AVX2 lane type of the lane-parallel ZFP coder (core/zfp_lanes.h: 8 blocks a vector, two
// vectors a group (lanes::Pair), plane tables through gathers) and BMI2 bit permutations for the
// scalar coder, each compiled for its instruction set only (the module stays baseline x86-64;
// cpu/zfp_kernels.cc picks a kernel at run time). Loads, stores and stream words as in
// cpu/zfp_avx512.h.
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

// The scalar plane coder's bit permutations as single BMI2 instructions (the same bits as
// PortableBits); fast on Intel since Haswell and AMD since Zen 3 (Zen 1/2 microcode them).
struct Bmi2Bits {
  template <typename UInt>
  __attribute__((target("bmi,bmi2"))) static uint64_t window(const UInt* u, int k) {
    constexpr int prec = 8 * sizeof(UInt);
    uint64_t m = 0;
    for (int i = 0; i < 4; i++)
      m |= _pdep_u64(static_cast<UInt>(u[i] << (prec - 1 - k)) >> (prec - 16),
                     0x1111111111111111ull << i);
    return detail::reverse_nibbles(m);
  }
  template <typename UInt>
  __attribute__((target("bmi,bmi2"))) static void deposit(UInt* u, int k, uint64_t w) {
    constexpr int prec = 8 * sizeof(UInt);
    uint64_t m = detail::reverse_nibbles(w);
    for (int i = 0; i < 4; i++)
      u[i] |= static_cast<UInt>(static_cast<UInt>(_pext_u64(m, 0x1111111111111111ull << i))
                                << (prec - 16)) >>
              (prec - 1 - k);
  }
  __attribute__((target("bmi,bmi2"))) static uint64_t compact(uint64_t w, int f) {
    return _pext_u64(w, ((uint64_t{1} << f) - 1) * 0x1111111111111111ull);
  }
  __attribute__((target("bmi,bmi2"))) static uint64_t expand(uint64_t w, int f) {
    return _pdep_u64(w, ((uint64_t{1} << f) - 1) * 0x1111111111111111ull);
  }
  __attribute__((target("bmi,bmi2"))) static uint64_t double_ones(uint32_t c) {
    uint64_t z = _pdep_u64(c, 0x5555555555555555ull);  // bit i to bit 2i, doubled where set
    return _pext_u64(z | z << 1, 0x5555555555555555ull | z << 1);
  }
};

#pragma GCC push_options
#pragma GCC target("avx2,f16c,fma,bmi,bmi2")

struct Avx2 : lanes::Planes32 {
  static constexpr int kLanes = 8;
  using V = __m256i;
  using M = __m256i;  // all ones in a selected lane

  static V set1(uint32_t v) { return _mm256_set1_epi32(static_cast<int>(v)); }
  static V add(V a, V b) { return _mm256_add_epi32(a, b); }
  static V sub(V a, V b) { return _mm256_sub_epi32(a, b); }
  static V and_(V a, V b) { return _mm256_and_si256(a, b); }
  static V or_(V a, V b) { return _mm256_or_si256(a, b); }
  static V xor_(V a, V b) { return _mm256_xor_si256(a, b); }
  static V or_and(V a, V b, V c) { return or_(a, and_(b, c)); }
  static V or_andn(V a, V b, V c) { return or_(a, _mm256_andnot_si256(c, b)); }
  template <int s>
  static V sll(V a) {
    return _mm256_slli_epi32(a, s);
  }
  template <int s>
  static V srl(V a) {
    return _mm256_srli_epi32(a, s);
  }
  template <int s>
  static V sra(V a) {
    return _mm256_srai_epi32(a, s);
  }
  static V sllv(V a, V n) { return _mm256_sllv_epi32(a, n); }
  static V srlv(V a, V n) { return _mm256_srlv_epi32(a, n); }
  static V shrdv(V lo, V hi, V n) { return or_(srlv(lo, n), sllv(hi, sub(set1(32), n))); }
  static V max_u(V a, V b) { return _mm256_max_epu32(a, b); }
  static M lt_s(V a, V b) { return _mm256_cmpgt_epi32(b, a); }
  static M gt_s(V a, V b) { return _mm256_cmpgt_epi32(a, b); }
  static M eq(V a, V b) { return _mm256_cmpeq_epi32(a, b); }
  static M mand(M a, M b) { return and_(a, b); }
  static bool any(M m) { return !_mm256_testz_si256(m, m); }
  static V select(M m, V a, V b) { return _mm256_blendv_epi8(b, a, m); }
  static V add_where(M m, V a, V b) { return add(a, and_(b, m)); }
  static M test_where(M m, V a, V b) { return _mm256_andnot_si256(eq(and_(a, b), set1(0)), m); }
  static V lookup4(V i, int v0, int v1, int v2, int v3) {
    return _mm256_permutevar8x32_epi32(_mm256_setr_epi32(v0, v1, v2, v3, 0, 0, 0, 0), i);
  }
  static V zero_where(M m, V a) { return _mm256_andnot_si256(m, a); }
  static __m256 ps(V a) { return _mm256_castsi256_ps(a); }
  static V si(__m256 a) { return _mm256_castps_si256(a); }
  static V fadd(V a, V b) { return si(_mm256_add_ps(ps(a), ps(b))); }
  static V scale_trunc(V f, V s) { return _mm256_cvttps_epi32(_mm256_mul_ps(ps(f), ps(s))); }
  static V int_scale(V i, V s) { return si(_mm256_mul_ps(_mm256_cvtepi32_ps(i), ps(s))); }

  // --- plane tables: gathers of packed entries ---------------------------------------------------
  static V gather(const void* t, V idx) {
    return _mm256_i32gather_epi32(static_cast<const int*>(t), idx, 4);
  }
  static void enc_lookup(V idx, V& bits, V& len, V& next) {
    V e = gather(kLuts.enc, idx);
    bits = and_(e, set1(0xff)), len = and_(srl<8>(e), set1(0xff)), next = srl<16>(e);
  }
  static V dec_lookup(V idx, V, V& e, V& len) {
    V entry = gather(kLuts.dec, and_(idx, set1(255)));
    e = and_(entry, set1(255)), len = and_(entry, set1(15));
    return srl<8>(entry);
  }
  static V funnel_count(V, V len) { return len; }

  // --- bit planes: a 4x4 byte transpose, then 8x8 bit transposes of 64-bit words ----------------
  static void bytes4x4(const V* u, V* b) {  // b[j] byte t = u[t] byte j; its own inverse
    const V odd = set1(0xff00ff00);
    V t0 = _mm256_blendv_epi8(u[0], sll<8>(u[1]), odd);
    V t1 = _mm256_blendv_epi8(srl<8>(u[0]), u[1], odd);
    V t2 = _mm256_blendv_epi8(u[2], sll<8>(u[3]), odd);
    V t3 = _mm256_blendv_epi8(srl<8>(u[2]), u[3], odd);
    b[0] = _mm256_blend_epi16(t0, sll<16>(t2), 0xaa);
    b[1] = _mm256_blend_epi16(t1, sll<16>(t3), 0xaa);
    b[2] = _mm256_blend_epi16(srl<16>(t0), t2, 0xaa);
    b[3] = _mm256_blend_epi16(srl<16>(t1), t3, 0xaa);
  }
  static V swap64(V x, int d, uint64_t mask) {
    V t = and_(xor_(_mm256_srli_epi64(x, d), x), _mm256_set1_epi64x(static_cast<long long>(mask)));
    return xor_(xor_(x, t), _mm256_slli_epi64(t, d));
  }
  static V transpose8(V x) {  // in each 64-bit word: bit c of byte r <-> bit r of byte c
    x = swap64(x, 7, 0x00aa00aa00aa00aaull);
    x = swap64(x, 14, 0x0000cccc0000ccccull);
    return swap64(x, 28, 0x00000000f0f0f0f0ull);
  }
  // The 64-bit words (a lane's two words) of lanes 0,1,4,5 and 2,3,6,7, transposed, to two
  // vectors of lane words (what unpacklo/unpackhi of those two vectors undo).
  static void pairs(V a, V b, V* lo, V* hi) {
    V lo_ = transpose8(_mm256_unpacklo_epi32(a, b)), hi_ = transpose8(_mm256_unpackhi_epi32(a, b));
    *lo = si(_mm256_shuffle_ps(ps(lo_), ps(hi_), _MM_SHUFFLE(2, 0, 2, 0)));
    *hi = si(_mm256_shuffle_ps(ps(lo_), ps(hi_), _MM_SHUFFLE(3, 1, 3, 1)));
  }
  static void planes(const V* u, V* p) {
    V b[4];
    bytes4x4(u, b);
    pairs(b[0], b[1], &p[0], &p[1]);
    pairs(b[2], b[3], &p[2], &p[3]);
  }
  static void unplanes(const V* p, V* u) {
    V b[4];
    pairs(p[0], p[1], &b[0], &b[1]);
    pairs(p[2], p[3], &b[2], &b[3]);
    bytes4x4(b, u);
  }

  // --- values: 32 of them, block j's value i to lane j of f[i] ----------------------------------
  // l[k] holds blocks 2k and 2k + 1.
  static void from_blocks(const V* l, V* f) {
    V r0 = _mm256_permute2x128_si256(l[0], l[2], 0x20),
      r1 = _mm256_permute2x128_si256(l[0], l[2], 0x31);
    V r2 = _mm256_permute2x128_si256(l[1], l[3], 0x20),
      r3 = _mm256_permute2x128_si256(l[1], l[3], 0x31);
    __m256 t0 = _mm256_unpacklo_ps(ps(r0), ps(r1)), t1 = _mm256_unpackhi_ps(ps(r0), ps(r1));
    __m256 t2 = _mm256_unpacklo_ps(ps(r2), ps(r3)), t3 = _mm256_unpackhi_ps(ps(r2), ps(r3));
    f[0] = si(_mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0)));
    f[1] = si(_mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2)));
    f[2] = si(_mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0)));
    f[3] = si(_mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2)));
  }
  static void to_blocks(const V* f, V* l) {
    __m256 t0 = _mm256_unpacklo_ps(ps(f[0]), ps(f[1])), t1 = _mm256_unpackhi_ps(ps(f[0]), ps(f[1]));
    __m256 t2 = _mm256_unpacklo_ps(ps(f[2]), ps(f[3])), t3 = _mm256_unpackhi_ps(ps(f[2]), ps(f[3]));
    V r0 = si(_mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0)));
    V r1 = si(_mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2)));
    V r2 = si(_mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0)));
    V r3 = si(_mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2)));
    l[0] = _mm256_permute2x128_si256(r0, r1, 0x20), l[1] = _mm256_permute2x128_si256(r2, r3, 0x20);
    l[2] = _mm256_permute2x128_si256(r0, r1, 0x31), l[3] = _mm256_permute2x128_si256(r2, r3, 0x31);
  }
  static __m128i load128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
  static void load(const float* x, V* f) {
    V l[4];
    for (int k = 0; k < 4; k++) l[k] = _mm256_loadu_si256(reinterpret_cast<const V*>(x + 8 * k));
    from_blocks(l, f);
  }
  static void load_bf16(const uint16_t* x, V* f) {
    V l[4];
    for (int k = 0; k < 4; k++) l[k] = sll<16>(_mm256_cvtepu16_epi32(load128(x + 8 * k)));
    from_blocks(l, f);
  }
  static void load_f16(const uint16_t* x, V* f) {
    V l[4];
    for (int k = 0; k < 4; k++) l[k] = si(_mm256_cvtph_ps(load128(x + 8 * k)));
    from_blocks(l, f);
  }
  static void store(const V* f, float* x) {
    V l[4];
    to_blocks(f, l);
    for (int k = 0; k < 4; k++) _mm256_storeu_si256(reinterpret_cast<V*>(x + 8 * k), l[k]);
  }
  static V round_bf16(V u) {
    M nan = gt_s(and_(u, set1(0x7fffffff)), set1(0x7f800000));
    V r = add(add(u, set1(0x7fff)), and_(srl<16>(u), set1(1)));
    r = select(nan, or_(and_(u, set1(0x80000000)), set1(0x7fc00000)), r);
    return and_(r, set1(0xffff0000));
  }
  static __m128i f16(V u) {
    return _mm256_cvtps_ph(ps(u), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static V round_f16(V u) { return si(_mm256_cvtph_ps(f16(u))); }
  // The high halves of r[i]'s lanes (block j's value i in lane j of r[i]) to 32 values.
  static void store_high_halves(const V* r, uint16_t* x) {
    V l[4];
    to_blocks(r, l);
    for (int k = 0; k < 2; k++) {
      V w = _mm256_packus_epi32(srl<16>(l[2 * k]), srl<16>(l[2 * k + 1]));
      _mm256_storeu_si256(reinterpret_cast<V*>(x + 16 * k), _mm256_permute4x64_epi64(w, 0xd8));
    }
  }
  static void store_f16(const V* f, uint16_t* x) {
    V l[4];
    to_blocks(f, l);
    for (int k = 0; k < 4; k++) _mm_storeu_si128(reinterpret_cast<__m128i*>(x + 8 * k), f16(l[k]));
  }

  // --- stream words ------------------------------------------------------------------------------
  static V load_words32(const uint32_t* w) {
    return _mm256_loadu_si256(reinterpret_cast<const V*>(w));
  }
  static void store_words32(V a, uint32_t* w) { _mm256_storeu_si256(reinterpret_cast<V*>(w), a); }
  static void load_words64(const uint64_t* w, V* a) {
    __m256 q0 = ps(_mm256_loadu_si256(reinterpret_cast<const V*>(w)));
    __m256 q1 = ps(_mm256_loadu_si256(reinterpret_cast<const V*>(w + 4)));
    a[0] = _mm256_permute4x64_epi64(si(_mm256_shuffle_ps(q0, q1, _MM_SHUFFLE(2, 0, 2, 0))), 0xd8);
    a[1] = _mm256_permute4x64_epi64(si(_mm256_shuffle_ps(q0, q1, _MM_SHUFFLE(3, 1, 3, 1))), 0xd8);
  }
  static void store_words64(const V* a, uint64_t* w) {
    V lo = _mm256_permute4x64_epi64(a[0], 0xd8), hi = _mm256_permute4x64_epi64(a[1], 0xd8);
    _mm256_storeu_si256(reinterpret_cast<V*>(w), _mm256_unpacklo_epi32(lo, hi));
    _mm256_storeu_si256(reinterpret_cast<V*>(w + 4), _mm256_unpackhi_epi32(lo, hi));
  }
};

#pragma GCC pop_options

}  // namespace x86
}  // namespace zfp
}  // namespace jaxhc
#endif  // __x86_64__
