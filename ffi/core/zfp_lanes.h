// ZFP's fixed-rate float32 coder over a group of blocks at once, lane j of every vector holding
// block j: the stream of core/zfp.h, which stays the reference and codes the groups this one
// declines. Generic over a lane type L (cpu/zfp_avx2.h and cpu/zfp_avx512.h have x86 ones).
//
// At a fixed rate every block owns maxbits bits, and for float32 zfp codes all 32 bit planes
// (kmin = 0), so the planes k = 31..0 run in lockstep over the lanes, each lane with its own coder
// state. A coder with 3 significant coefficients codes every plane as its 4 bits, as one with 4
// does, so a plane is one lookup in a table keyed by (min(n, 3), plane nibble) when encoding, by
// (min(n, 3), next stream bits) when decoding. Every plane costs a lane at least one bit, so the
// loop ends after at most maxbits - 9 planes (it stops when every lane has its maxbits bits).
//
// What a lane type provides (V: kLanes uint32 lanes, M: a lane mask):
//   set1, add, sub, and_, or_, xor_; or_and(a, b, c) = a | (b & c)
//   sll<s>, srl<s>, sra<s>; sllv, srlv: per-lane counts, 0 where a count is 32 or more (unsigned)
//   max_u; lt_s, gt_s, eq -> M; mand; any(M); select(m, a, b) = m ? a : b; zero_where(m, a)
//   scale_trunc(f, s): int32(float(f) * float(s)) truncated
//   int_scale(i, s): float(int32(i)) * float(s)
//   enc_lookup(idx, bits, len, next): kLuts below
//   planes(u, p), unplanes(p, u): the bit planes of 4 coefficients in the layout of Planes32
//     below (which the type derives from), coefficient i in bit i of a plane's nibble
// The planes are decoded in the lanes of PlaneLanes<L>::type (D; L itself unless a lane type says
// otherwise), which provides, besides the operations above on its own lanes (kBits wide, a
// plane layout Planes32 or Planes16):
//   or_andn(a, b, c) = a | (b & ~c); add_where(m, a, b) = m ? a + b : a
//   test_where(m, a, b) = m && (a & b) != 0; lookup4(i, v0, v1, v2, v3): v_i for 0 <= i < 4
//   shrdv(lo, hi, c): the low word of (hi:lo) >> c, 0 <= c < kBits
//   dec_lookup(idx, st, e, len) -> next st, with e = len | x << 4 (kLuts below)
//   funnel_count(e, len): e or len, whichever shrdv takes as len
//   unless D is L: from_words<W>(in, a) (a block's W 32-bit words to its kBits words) and
//   unplanes(p, u) (planes in D's layout to L's coefficients)
#pragma once
#include <type_traits>

#include "core/zfp.h"

namespace jaxhc {
namespace zfp {
namespace lanes {

// How a lane type holds the 32 bit planes of a lane's block: plane k in bits plane_shift(k)..+3
// of word plane_word(k) of kPlaneWords words of kBits bits. With 32-bit words, plane k sits in
// byte k & 3 of word plane_word(k), in the nibble (k >> 3) & 1: the layout an 8x8 bit transpose
// of 8 coefficient bytes (4 of byte column j, 4 of column j + 1) gives, split into two words.
struct Planes32 {
  static constexpr int kBits = 32, kPlaneWords = 4;
  static JAXHC_HD constexpr int plane_word(int k) { return 2 * (k >> 4) + ((k >> 2) & 1); }
  static JAXHC_HD constexpr int plane_shift(int k) { return 8 * (k & 3) + 4 * ((k >> 3) & 1); }
};

// The same bytes in 16-bit words: word m of the 8 bytes of byte columns 2jp, 2jp + 1 is word
// 4 jp + m.
struct Planes16 {
  static constexpr int kBits = 16, kPlaneWords = 8;
  static JAXHC_HD constexpr int plane_word(int k) { return 4 * (k >> 4) + ((k & 7) >> 1); }
  static JAXHC_HD constexpr int plane_shift(int k) { return 8 * (k & 1) + 4 * ((k >> 3) & 1); }
};

// The lanes a group's planes are decoded in: the coder's own unless a lane type says otherwise
// (narrower lanes doing the same work in fewer instructions).
template <class L>
struct PlaneLanes {
  using type = L;
};

// Coder states. Encoding: n16 = 16 * min(n, 3), and a plane's index is n16 | nibble. Decoding:
// st = 255 - (127 >> min(n, 3)); the index of a plane whose stream bits start with s is
// ((st << 1) | (s & ~st)) & 255: 128 entries for n = 0 (7 bits), then 64, 32 and 16.
JAXHC_HD constexpr uint32_t dec_state(int n) { return 255u - (127u >> (n < 3 ? n : 3)); }

struct Luts {
  uint8_t enc_bits[64], enc_len[64], enc_next[64];  // code, its length, next n16
  uint32_t enc[64];                                 // bits | len << 8 | next << 16
  uint8_t dec_lenx[256], dec_next[256];             // len | x << 4, and the next st
  uint32_t dec[256];                                // len | x << 4 | next st << 8
};

constexpr Luts make_luts() {
  Luts t{};
  for (int n = 0; n < 4; n++) {
    for (uint32_t x = 0; x < 16; x++) {
      detail::Plane p = detail::encode_plane(n, x);
      int i = 16 * n + static_cast<int>(x), next = 16 * (p.n < 3 ? p.n : 3);
      t.enc_bits[i] = static_cast<uint8_t>(p.bits);
      t.enc_len[i] = static_cast<uint8_t>(p.len);
      t.enc_next[i] = static_cast<uint8_t>(next);
      t.enc[i] = p.bits | static_cast<uint32_t>(p.len) << 8 | static_cast<uint32_t>(next) << 16;
    }
    uint32_t st = dec_state(n), lim = ~st & 255, base = (st << 1) & 255;
    for (uint32_t s = 0; s <= lim; s++) {
      detail::Plane p = detail::decode_plane(n, s, detail::kMaxPlaneCode);
      uint32_t lenx = static_cast<uint32_t>(p.len) | p.bits << 4, next = dec_state(p.n);
      t.dec_lenx[base | s] = static_cast<uint8_t>(lenx);
      t.dec_next[base | s] = static_cast<uint8_t>(next);
      t.dec[base | s] = lenx | next << 8;
    }
  }
  return t;
}

#if JAXHC_ZFP_PLANE_TABLES
inline constexpr Luts kLuts = make_luts();
#endif

template <class L>
struct Coder {
  using V = typename L::V;
  using M = typename L::M;

  static JAXHC_HD V c(uint32_t v) { return L::set1(v); }

  // A lane's block in W words, low bits first; bits are appended at pos (the part of a code past
  // word W - 1 falls off; the caller masks what lies past maxbits).
  template <int W>
  struct Encoder {
    V p[4], a[W], n16, pos, end;

    template <int k>
    JAXHC_HD bool plane() {
      V idx = L::or_and(n16, L::template srl<L::plane_shift(k)>(p[L::plane_word(k)]), c(15));
      V bits, len;
      L::enc_lookup(idx, bits, len, n16);
      a[0] = L::or_(a[0], L::sllv(bits, pos));
      for (int j = 1; j < W; j++)
        a[j] = L::or_(a[j], L::or_(L::sllv(bits, L::sub(pos, c(32 * j))),
                                   L::srlv(bits, L::sub(c(32 * j), pos))));
      pos = L::add(pos, len);
      return L::any(L::lt_s(pos, end));
    }

    template <int k>
    JAXHC_HD void run() {
      if constexpr (k >= 0)
        if (plane<k>()) run<k - 1>();
    }
  };

  // Decodes the planes of a group in the lanes of D. The stream bits still to decode sit in kA
  // words (next bit at bit 0 of a[0], zeros past maxbits). Planes decode as if each lane's stream
  // went on with zeros, which gives zfp's plane wherever its code fits in the budget, and, where
  // the budget cuts it short, everywhere but in a scan for the next one-bit (or right after the
  // group test that starts one): there zfp takes the scan's position q as that one-bit, while
  // the zeros run on to the implied one-bit 3 (bit 3 of a plane is set no other way in a cut
  // code) and read the 3 - q bits past the budget by which the lane overshoots it. Each lane's
  // last plane is corrected so as it is decoded; later planes read zeros and decode to 0.
  template <class D, int W>
  struct Decoder {
    using DV = typename D::V;
    using DM = typename D::M;
    static constexpr int kA = W * 32 / D::kBits;
    DV p[D::kPlaneWords], a[kA], st, pos, end, last, near;  // last = end - 1, near = end - 8

    static JAXHC_HD DV d(uint32_t v) { return D::set1(v); }

    // Plane k. Safe: no lane can reach the budget in it (pos + 7 < end: a plane's code is at most
    // 7 bits), so none needs the correction; returns whether plane k - 1 is safe too. Otherwise
    // returns whether a lane has bits left.
    template <int k, bool Safe>
    JAXHC_HD bool plane() {
      constexpr int w = D::plane_word(k), sh = D::plane_shift(k);
      DV e, len;  // e: len | x << 4
      DV next = D::dec_lookup(D::or_andn(D::template sll<1>(st), a[0], st), st, e, len);
      DV count = D::funnel_count(e, len);
      for (int j = 0; j + 1 < kA; j++) a[j] = D::shrdv(a[j], a[j + 1], count);
      a[kA - 1] = D::srlv(a[kA - 1], len);
      pos = D::add(pos, len);
      st = next;
      if constexpr (!Safe) {  // x's bit 3 moves to bit 3 - (pos - end) where a scan crossed it
        DM scan = D::test_where(D::gt_s(pos, last), e, d(8 << 4));
        e = D::add_where(scan, e, D::lookup4(D::sub(pos, end), 0, -4 * 16, -6 * 16, -7 * 16));
      }
      if constexpr (sh == 0)  // p[w] |= x << sh
        p[w] = D::or_(p[w], D::template srl<4>(e));
      else if constexpr (sh == 4)
        p[w] = D::or_and(p[w], e, d(0xf0));
      else
        p[w] = D::or_and(p[w], D::template sll<sh - 4>(e), d(0xfu << sh));
      if constexpr (Safe)
        return !D::any(D::gt_s(pos, near));
      else
        return D::any(D::lt_s(pos, end));
    }

    JAXHC_HD void start(const DV* words, int maxbits) {  // words: a block's W 32-bit words
      for (int j = 0; j + 1 < kA; j++) a[j] = D::shrdv(words[j], words[j + 1], d(9));
      a[kA - 1] = D::template srl<9>(words[kA - 1]);
      for (int i = 0; i < D::kPlaneWords; i++) p[i] = d(0);
      st = d(dec_state(0)), pos = d(9);
      end = d(static_cast<uint32_t>(maxbits)), last = d(static_cast<uint32_t>(maxbits - 1));
      near = d(static_cast<uint32_t>(maxbits - 8));
    }
  };

  // G decoders (groups) in lockstep, plane by plane: a group's planes are a chain of dependent
  // lookups, and the out-of-order core overlaps the chains of different groups.
  template <class D, int W, int G>
  struct Decoders {
    Decoder<D, W> g[G];

    template <int k, bool Safe>
    JAXHC_HD bool plane() {
      bool r = Safe;
      for (int i = 0; i < G; i++) {
        bool b = g[i].template plane<k, Safe>();
        r = Safe ? r & b : r | b;
      }
      return r;
    }
    // Safe planes from k on while they stay safe; returns the first plane that may not be.
    template <int k>
    JAXHC_HD int run_safe() {
      if constexpr (k >= 0)
        if (plane<k, true>()) return run_safe<k - 1>();
      return k - 1;
    }
    // Planes from k on, each plane's code once (a plane that follows a safe one is entered by
    // the switch), until no lane has bits left.
    JAXHC_HD void run(int maxbits) {
      // clang-format off
#define JAXHC_PLANE(k) case k: if (!plane<k, false>()) return; [[fallthrough]];
      switch (maxbits >= 9 + 8 ? run_safe<31>() : 31) {
        JAXHC_PLANE(31) JAXHC_PLANE(30) JAXHC_PLANE(29) JAXHC_PLANE(28) JAXHC_PLANE(27)
        JAXHC_PLANE(26) JAXHC_PLANE(25) JAXHC_PLANE(24) JAXHC_PLANE(23) JAXHC_PLANE(22)
        JAXHC_PLANE(21) JAXHC_PLANE(20) JAXHC_PLANE(19) JAXHC_PLANE(18) JAXHC_PLANE(17)
        JAXHC_PLANE(16) JAXHC_PLANE(15) JAXHC_PLANE(14) JAXHC_PLANE(13) JAXHC_PLANE(12)
        JAXHC_PLANE(11) JAXHC_PLANE(10) JAXHC_PLANE(9) JAXHC_PLANE(8) JAXHC_PLANE(7)
        JAXHC_PLANE(6) JAXHC_PLANE(5) JAXHC_PLANE(4) JAXHC_PLANE(3) JAXHC_PLANE(2)
        JAXHC_PLANE(1) case 0: plane<0, false>();
      }
#undef JAXHC_PLANE
      // clang-format on
    }
  };

  static JAXHC_HD void fwd_lift(V* u) {
    V x = u[0], y = u[1], z = u[2], w = u[3];
    x = L::add(x, w), x = L::template sra<1>(x), w = L::sub(w, x);
    z = L::add(z, y), z = L::template sra<1>(z), y = L::sub(y, z);
    x = L::add(x, z), x = L::template sra<1>(x), z = L::sub(z, x);
    w = L::add(w, y), w = L::template sra<1>(w), y = L::sub(y, w);
    w = L::add(w, L::template sra<1>(y)), y = L::sub(y, L::template sra<1>(w));
    u[0] = x, u[1] = y, u[2] = z, u[3] = w;
  }

  static JAXHC_HD void inv_lift(V* u) {
    V x = u[0], y = u[1], z = u[2], w = u[3];
    y = L::add(y, L::template sra<1>(w)), w = L::sub(w, L::template sra<1>(y));
    y = L::add(y, w), w = L::template sll<1>(w), w = L::sub(w, y);
    z = L::add(z, x), x = L::template sll<1>(x), x = L::sub(x, z);
    y = L::add(y, z), z = L::template sll<1>(z), z = L::sub(z, y);
    w = L::add(w, x), x = L::template sll<1>(x), x = L::sub(x, w);
    u[0] = x, u[1] = y, u[2] = z, u[3] = w;
  }

  // Bits past maxbits cleared in a block of W words.
  template <int W>
  static JAXHC_HD void clip(V* a, int maxbits) {
    for (int j = 0; j < W; j++) {
      int left = maxbits - 32 * j;
      if (left <= 0)
        a[j] = c(0);
      else if (left < 32)
        a[j] = L::and_(a[j], c((1u << left) - 1));
    }
  }

  // f[i]: the float32 bits of value i of each lane's block. Writes each lane's maxbits bits (at
  // most 32 W) to out and returns true; or returns false and writes nothing when a value is not
  // finite or a nonzero block's exponent is below -96 (zfp's scale factor 2^(30 - emax) is then
  // not a normal float): the scalar coder takes such a group.
  template <int W>
  static JAXHC_HD bool encode(const V* f, int maxbits, V* out) {
    V amax = c(0);
    for (int i = 0; i < 4; i++) amax = L::max_u(amax, L::and_(f[i], c(0x7fffffff)));
    M tiny = L::mand(L::gt_s(amax, c(0)), L::lt_s(amax, c(30u << 23)));
    if (L::any(L::gt_s(amax, c(0x7f7fffff))) || L::any(tiny)) return false;
    V e = L::template srl<23>(amax);  // biased exponent of the largest value: emax = e - 126
    V scale = L::template sll<23>(L::sub(c(283), e));  // 2^(30 - emax)
    V u[4];
    for (int i = 0; i < 4; i++) u[i] = L::scale_trunc(f[i], scale);
    fwd_lift(u);
    for (int i = 0; i < 4; i++) u[i] = L::xor_(L::add(u[i], c(0xaaaaaaaa)), c(0xaaaaaaaa));
    Encoder<W> enc;
    L::planes(u, enc.p);
    enc.a[0] = L::zero_where(L::eq(amax, c(0)), L::add(L::add(e, e), c(3)));  // 2 (emax + 127) + 1
    for (int j = 1; j < W; j++) enc.a[j] = c(0);
    enc.n16 = c(0), enc.pos = c(1 + 8), enc.end = c(static_cast<uint32_t>(maxbits));
    enc.template run<31>();
    clip<W>(enc.a, maxbits);
    for (int j = 0; j < W; j++) out[j] = enc.a[j];
    return true;
  }

  // in: G groups' W words each (group i at in + W i), each lane's maxbits bits (zeros past
  // maxbits). Writes the float32 bits of the 4 values of each lane's block to f (group i at
  // f + 4 i) and returns true, or returns false when a block's scale factor 2^(emax - 30) is
  // subnormal (the scalar coder decodes such groups).
  template <int W, int G>
  static JAXHC_HD bool decode(const V* in, int maxbits, V* f) {
    M nonzero[G];
    V ebits[G];
    for (int i = 0; i < G; i++) {
      nonzero[i] = L::eq(L::and_(in[W * i], c(1)), c(1));
      ebits[i] = L::and_(L::template srl<1>(in[W * i]), c(255));  // emax + 127
      if (L::any(L::mand(nonzero[i], L::lt_s(ebits[i], c(31))))) return false;
    }
    using D = typename PlaneLanes<L>::type;
    Decoders<D, W, G> dec;
    for (int i = 0; i < G; i++) {
      typename D::V words[Decoder<D, W>::kA];
      if constexpr (std::is_same_v<D, L>)
        for (int j = 0; j < W; j++) words[j] = in[W * i + j];
      else
        D::template from_words<W>(in + W * i, words);
      dec.g[i].start(words, maxbits);
    }
    dec.run(maxbits);
    for (int i = 0; i < G; i++) {
      V u[4];
      if constexpr (std::is_same_v<D, L>)
        L::unplanes(dec.g[i].p, u);
      else
        D::unplanes(dec.g[i].p, u);
      for (int t = 0; t < 4; t++) u[t] = L::sub(L::xor_(u[t], c(0xaaaaaaaa)), c(0xaaaaaaaa));
      inv_lift(u);
      V scale = L::template sll<23>(L::sub(ebits[i], c(30)));  // 2^(emax - 30)
      for (int t = 0; t < 4; t++)
        f[4 * i + t] = L::select(nonzero[i], L::int_scale(u[t], scale), c(0));
    }
    return true;
  }
};

// Two lane vectors as one: groups of twice the blocks, in two independent halves. A plane is a
// chain of dependent lookups; the out-of-order core overlaps the two halves' chains.
template <class L>
struct Pair : Planes32 {
  using H = typename L::V;
  using HM = typename L::M;
  static constexpr int kLanes = 2 * L::kLanes;
  struct V {
    H lo, hi;
  };
  struct M {
    HM lo, hi;
  };

#define JAXHC_PAIR1(name) \
  static JAXHC_HD V name(V a) { return {L::name(a.lo), L::name(a.hi)}; }
#define JAXHC_PAIR2(name) \
  static JAXHC_HD V name(V a, V b) { return {L::name(a.lo, b.lo), L::name(a.hi, b.hi)}; }
#define JAXHC_PAIR3(name)                                          \
  static JAXHC_HD V name(V a, V b, V c) {                          \
    return {L::name(a.lo, b.lo, c.lo), L::name(a.hi, b.hi, c.hi)}; \
  }
#define JAXHC_PAIR_CMP(name) \
  static JAXHC_HD M name(V a, V b) { return {L::name(a.lo, b.lo), L::name(a.hi, b.hi)}; }
  // clang-format off
  JAXHC_PAIR2(add) JAXHC_PAIR2(sub) JAXHC_PAIR2(and_) JAXHC_PAIR2(or_) JAXHC_PAIR2(xor_)
  JAXHC_PAIR3(or_and) JAXHC_PAIR3(or_andn) JAXHC_PAIR2(sllv) JAXHC_PAIR2(srlv) JAXHC_PAIR3(shrdv)
  JAXHC_PAIR2(funnel_count)
  JAXHC_PAIR2(max_u) JAXHC_PAIR2(fadd) JAXHC_PAIR2(scale_trunc) JAXHC_PAIR2(int_scale)
  JAXHC_PAIR1(round_bf16) JAXHC_PAIR1(round_f16)
  JAXHC_PAIR_CMP(lt_s) JAXHC_PAIR_CMP(gt_s) JAXHC_PAIR_CMP(eq)
  // clang-format on
#undef JAXHC_PAIR1
#undef JAXHC_PAIR2
#undef JAXHC_PAIR3
#undef JAXHC_PAIR_CMP

                      static JAXHC_HD V set1(uint32_t v) {
    return {L::set1(v), L::set1(v)};
  }
  template <int s>
  static JAXHC_HD V sll(V a) {
    return {L::template sll<s>(a.lo), L::template sll<s>(a.hi)};
  }
  template <int s>
  static JAXHC_HD V srl(V a) {
    return {L::template srl<s>(a.lo), L::template srl<s>(a.hi)};
  }
  template <int s>
  static JAXHC_HD V sra(V a) {
    return {L::template sra<s>(a.lo), L::template sra<s>(a.hi)};
  }
  static JAXHC_HD M mand(M a, M b) { return {L::mand(a.lo, b.lo), L::mand(a.hi, b.hi)}; }
  static JAXHC_HD M test_where(M m, V a, V b) {
    return {L::test_where(m.lo, a.lo, b.lo), L::test_where(m.hi, a.hi, b.hi)};
  }
  static JAXHC_HD V lookup4(V i, int v0, int v1, int v2, int v3) {
    return {L::lookup4(i.lo, v0, v1, v2, v3), L::lookup4(i.hi, v0, v1, v2, v3)};
  }
  static JAXHC_HD V add_where(M m, V a, V b) {
    return {L::add_where(m.lo, a.lo, b.lo), L::add_where(m.hi, a.hi, b.hi)};
  }
  static JAXHC_HD V dec_lookup(V idx, V st, V& e, V& len) {
    return {L::dec_lookup(idx.lo, st.lo, e.lo, len.lo), L::dec_lookup(idx.hi, st.hi, e.hi, len.hi)};
  }
  static JAXHC_HD void unplanes(const V* p, V* u) {
    halves<4>(p, u, [](const H* a, H* b, int) { L::unplanes(a, b); });
  }
  static JAXHC_HD bool any(M m) { return L::any(m.lo) || L::any(m.hi); }
  static JAXHC_HD V select(M m, V a, V b) {
    return {L::select(m.lo, a.lo, b.lo), L::select(m.hi, a.hi, b.hi)};
  }
  static JAXHC_HD V zero_where(M m, V a) {
    return {L::zero_where(m.lo, a.lo), L::zero_where(m.hi, a.hi)};
  }
  static JAXHC_HD void enc_lookup(V idx, V& bits, V& len, V& next) {
    L::enc_lookup(idx.lo, bits.lo, len.lo, next.lo);
    L::enc_lookup(idx.hi, bits.hi, len.hi, next.hi);
  }

  // Functions of N vectors at once, on the N low and then the N high halves.
  template <int N, class F>
  static JAXHC_HD void halves(const V* in, V* out, F&& f) {
    H lo[N], hi[N], olo[N], ohi[N];
    for (int i = 0; i < N; i++) lo[i] = in[i].lo, hi[i] = in[i].hi;
    f(lo, olo, 0), f(hi, ohi, 1);
    for (int i = 0; i < N; i++) out[i] = {olo[i], ohi[i]};
  }
  static JAXHC_HD void planes(const V* u, V* p) {
    halves<4>(u, p, [](const H* a, H* b, int) { L::planes(a, b); });
  }

  template <class T, class F>
  static JAXHC_HD void load_with(const T* x, V* f, F&& load) {  // x: 4 kLanes values
    halves<4>(f, f, [&](const H*, H* out, int h) { load(x + h * 4 * L::kLanes, out); });
  }
  template <class T, class F>
  static JAXHC_HD void store_with(const V* f, T* x, F&& store) {
    H lo[4], hi[4];
    for (int i = 0; i < 4; i++) lo[i] = f[i].lo, hi[i] = f[i].hi;
    store(lo, x), store(hi, x + 4 * L::kLanes);
  }
  static JAXHC_HD void load(const float* x, V* f) {
    load_with(x, f, [](const float* p, H* o) { L::load(p, o); });
  }
  static JAXHC_HD void load_bf16(const uint16_t* x, V* f) {
    load_with(x, f, [](const uint16_t* p, H* o) { L::load_bf16(p, o); });
  }
  static JAXHC_HD void load_f16(const uint16_t* x, V* f) {
    load_with(x, f, [](const uint16_t* p, H* o) { L::load_f16(p, o); });
  }
  static JAXHC_HD void store(const V* f, float* x) {
    store_with(f, x, [](const H* v, float* p) { L::store(v, p); });
  }
  static JAXHC_HD void store_high_halves(const V* f, uint16_t* x) {
    store_with(f, x, [](const H* v, uint16_t* p) { L::store_high_halves(v, p); });
  }
  static JAXHC_HD void store_f16(const V* f, uint16_t* x) {
    store_with(f, x, [](const H* v, uint16_t* p) { L::store_f16(v, p); });
  }

  static JAXHC_HD V load_words32(const uint32_t* w) {
    return {L::load_words32(w), L::load_words32(w + L::kLanes)};
  }
  static JAXHC_HD void store_words32(V a, uint32_t* w) {
    L::store_words32(a.lo, w), L::store_words32(a.hi, w + L::kLanes);
  }
  static JAXHC_HD void load_words64(const uint64_t* w, V* a) {
    H lo[2], hi[2];
    L::load_words64(w, lo), L::load_words64(w + L::kLanes, hi);
    a[0] = {lo[0], hi[0]}, a[1] = {lo[1], hi[1]};
  }
  static JAXHC_HD void store_words64(const V* a, uint64_t* w) {
    H lo[2] = {a[0].lo, a[1].lo}, hi[2] = {a[0].hi, a[1].hi};
    L::store_words64(lo, w), L::store_words64(hi, w + L::kLanes);
  }
};

}  // namespace lanes
}  // namespace zfp
}  // namespace jaxhc
