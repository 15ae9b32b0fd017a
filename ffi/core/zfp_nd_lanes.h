// The 2-D/3-D fixed-rate coder of core/zfp_nd.h (float32) over a group of blocks at once, lane j
// of every vector holding block j: the block-floating-point conversion, the decorrelating
// transform, the sequency order, negabinary and the bit transposes to and from bit planes, all as
// the same vertical operations on every lane (no shuffles). What stays per block is the bit-plane
// code itself (core/zfp_nd.h's encode_planes / decode_planes, on the planes this coder gives or
// takes), whose lengths differ from block to block. Generic over a lane type L (core/zfp_lanes.h
// lists the operations; this coder uses set1, add, sub, and_, or_, xor_, sll, srl, sra, max_u,
// lt_s, gt_s, eq, mand, any, select, scale_trunc and int_scale).
//
// Planes travel in memory as a group's 32-bit words: plane k of lane j's block in
// planes[h][k][j] holds coefficients 32 h .. 32 h + 31 (h < 2 in 3-D; 2-D has one half).
#pragma once
#include "core/zfp_nd.h"

namespace jaxhc {
namespace zfp {
namespace lanes {

template <class L, int D>
struct NdCoder {
  using V = typename L::V;
  using M = typename L::M;
  static constexpr int S = block_values(D);  // values (coefficients) of a block
  static constexpr int K = L::kLanes;        // blocks of a group
  static constexpr int H = (S + 31) / 32;    // 32-bit halves of a plane
  using Planes = uint32_t[H][32][K];

  static JAXHC_HD V c(uint32_t v) { return L::set1(v); }

  // zfp's lifts of the 4 values u[0], u[s], u[2s], u[3s] of every lane (core/zfp.h's fwd_lift).
  template <int s>
  static JAXHC_HD void fwd_lift(V* u) {
    V x = u[0], y = u[s], z = u[2 * s], w = u[3 * s];
    x = L::add(x, w), x = L::template sra<1>(x), w = L::sub(w, x);
    z = L::add(z, y), z = L::template sra<1>(z), y = L::sub(y, z);
    x = L::add(x, z), x = L::template sra<1>(x), z = L::sub(z, x);
    w = L::add(w, y), w = L::template sra<1>(w), y = L::sub(y, w);
    w = L::add(w, L::template sra<1>(y)), y = L::sub(y, L::template sra<1>(w));
    u[0] = x, u[s] = y, u[2 * s] = z, u[3 * s] = w;
  }

  template <int s>
  static JAXHC_HD void inv_lift(V* u) {
    V x = u[0], y = u[s], z = u[2 * s], w = u[3 * s];
    y = L::add(y, L::template sra<1>(w)), w = L::sub(w, L::template sra<1>(y));
    y = L::add(y, w), w = L::template sll<1>(w), w = L::sub(w, y);
    z = L::add(z, x), x = L::template sll<1>(x), x = L::sub(x, z);
    y = L::add(y, z), z = L::template sll<1>(z), z = L::sub(z, y);
    w = L::add(w, x), x = L::template sll<1>(x), x = L::sub(x, w);
    u[0] = x, u[s] = y, u[2 * s] = z, u[3 * s] = w;
  }

  static JAXHC_HD void fwd_xform(V* u) {  // along x, then y, then z (core/zfp_nd.h)
    for (int r = 0; r < S; r += 4) fwd_lift<1>(u + r);
    for (int z = 0; z < S; z += 16)
      for (int x = 0; x < 4; x++) fwd_lift<4>(u + z + x);
    if constexpr (D == 3)
      for (int i = 0; i < 16; i++) fwd_lift<16>(u + i);
  }

  static JAXHC_HD void inv_xform(V* u) {  // along z, then y, then x
    if constexpr (D == 3)
      for (int i = 0; i < 16; i++) inv_lift<16>(u + i);
    for (int z = 0; z < S; z += 16)
      for (int x = 0; x < 4; x++) inv_lift<4>(u + z + x);
    for (int r = 0; r < S; r += 4) inv_lift<1>(u + r);
  }

  // core/zfp_nd.h's transpose_bits of 32x32 bit matrices, one per lane: a[c] bit r takes a[r]
  // bit c.
  template <int J>
  static JAXHC_HD void transpose_stage(V* a) {
    const V m = c(detail::low_stripes<uint32_t>(J));
    for (int b = 0; b < 32; b += 2 * J) {
      for (int k = b; k < b + J; k++) {
        V t = L::and_(L::xor_(L::template srl<J>(a[k]), a[k + J]), m);
        a[k + J] = L::xor_(a[k + J], t);
        a[k] = L::xor_(a[k], L::template sll<J>(t));
      }
    }
    if constexpr (J > 1) transpose_stage<J / 2>(a);
  }

  // f[i]: the float32 bits of value i of each lane's block. Writes head[j], the first 9 bits of
  // lane j's code (1 and the biased exponent; 0 for a block of zeros, whose code is all zeros),
  // and its planes, and returns true; or returns false and writes nothing when a value is not
  // finite or a nonzero block's exponent is below -96 (zfp's scale factor 2^(30 - emax) is then
  // not a normal float): the scalar coder takes such a group.
  static JAXHC_HD bool encode(const V* f, uint32_t* head, Planes& planes) {
    V amax = c(0);
    for (int i = 0; i < S; i++) amax = L::max_u(amax, L::and_(f[i], c(0x7fffffff)));
    M tiny = L::mand(L::gt_s(amax, c(0)), L::lt_s(amax, c(30u << 23)));
    if (L::any(L::gt_s(amax, c(0x7f7fffff))) || L::any(tiny)) return false;
    V e = L::template srl<23>(amax);  // biased exponent of the largest value: emax = e - 126
    V scale = L::template sll<23>(L::sub(c(283), e));  // 2^(30 - emax)
    V zero = c(0);
    V h = L::select(L::eq(amax, zero), zero, L::add(L::add(e, e), c(3)));  // 2 (emax + 127) + 1
    L::store_words32(h, head);
    V u[S];
    for (int i = 0; i < S; i++) u[i] = L::scale_trunc(f[i], scale);
    fwd_xform(u);
    const V nb = c(0xaaaaaaaa);
    for (int g = 0; g < H; g++) {
      V a[32];
      for (int r = 0; r < 32; r++)
        a[r] = 32 * g + r < S ? L::xor_(L::add(u[detail::perm<D>(32 * g + r)], nb), nb) : zero;
      transpose_stage<16>(a);
      for (int k = 0; k < 32; k++) L::store_words32(a[k], planes[g][k]);
    }
    return true;
  }

  // ebits[j]: lane j's biased exponent emax + 127 (any value for a block of zeros, whose planes
  // are all zero). Writes the float32 bits of value i of each lane's block to f[i] and returns
  // true, or returns false when a nonzero block's scale factor 2^(emax - 30) is subnormal (the
  // scalar coder decodes such groups).
  static JAXHC_HD bool decode(const uint32_t* ebits, const bool* nonzero, const Planes& planes,
                              V* f) {
    uint32_t eb[K];
    for (int j = 0; j < K; j++) {
      if (nonzero[j] && ebits[j] < 31) return false;
      eb[j] = nonzero[j] ? ebits[j] : 157;  // zeros scale by 1: +0
    }
    V u[S];
    const V nb = c(0xaaaaaaaa);
    for (int g = 0; g < H; g++) {
      V a[32];
      for (int k = 0; k < 32; k++) a[k] = L::load_words32(planes[g][k]);
      transpose_stage<16>(a);
      for (int r = 0; r < 32 && 32 * g + r < S; r++)
        u[detail::perm<D>(32 * g + r)] = L::sub(L::xor_(a[r], nb), nb);
    }
    inv_xform(u);
    V scale = L::template sll<23>(L::sub(L::load_words32(eb), c(30)));  // 2^(emax - 30)
    for (int i = 0; i < S; i++) f[i] = L::int_scale(u[i], scale);
    return true;
  }
};

}  // namespace lanes
}  // namespace zfp
}  // namespace jaxhc
