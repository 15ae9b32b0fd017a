// ZFP's embedded bit-plane coder for 4-value blocks (zfp's encode_few_ints / decode_few_ints),
// host and device code; ffi/core/zfp.h builds the codec around it.
//
// The coefficients u[0..3] (negabinary) are sent bit plane by bit plane from the top, plane k as a
// nibble x (bit i = bit k of u[i]). While n coefficients are significant, a plane codes as its n
// low bits verbatim, then group tests: a 1 if a one-bit is left (then a unary scan to it, the last
// position's one-bit implied, and again), a 0 when none is; once n == 4 a plane is its 4 bits. The
// code stops after `budget` bits, wherever that falls. Here planes are handled in runs (planes
// where n does not change: the same n + 1 bits of each nibble, moved in bulk) and events (the plane
// where n grows: a table lookup), through a 16-plane window of nibbles (a 4x16 bit transpose).
#pragma once
#include "core/common.h"

namespace jaxhc {
namespace zfp {
namespace detail {

JAXHC_HD int clz(uint32_t x) { return clz32(x); }
JAXHC_HD int clz(uint64_t x) { return clz64(x); }

JAXHC_HD int ctz64(uint64_t x) {  // x != 0
#if defined(__CUDA_ARCH__)
  return __ffsll(static_cast<long long>(x)) - 1;
#else
  return __builtin_ctzll(x);
#endif
}

JAXHC_HD uint64_t bswap64(uint64_t x) {
#if defined(__CUDA_ARCH__)
  uint32_t lo = __byte_perm(static_cast<uint32_t>(x), 0, 0x0123);
  uint32_t hi = __byte_perm(static_cast<uint32_t>(x >> 32), 0, 0x0123);
  return (static_cast<uint64_t>(lo) << 32) | hi;
#else
  return __builtin_bswap64(x);
#endif
}

JAXHC_HD int min_int(int a, int b) { return a < b ? a : b; }

JAXHC_HD uint64_t low_bits(uint64_t v, int n) { return n >= 64 ? v : v & ((uint64_t{1} << n) - 1); }

// Bits [pos, pos + n) of a bit buffer, 0 < n <= 64; reads no word past the one holding bit pos+n-1.
JAXHC_HD uint64_t get_bits(const uint64_t* w, int pos, int n) {
  int q = pos >> 6, s = pos & 63;
  uint64_t v = w[q] >> s;
  if (s && s + n > 64) v |= w[q + 1] << (64 - s);
  return low_bits(v, n);
}

// ORs the n low bits of v (no bits above them set) into a bit buffer at pos.
JAXHC_HD void put_bits(uint64_t* w, int pos, uint64_t v, int n) {
  int q = pos >> 6, s = pos & 63;
  w[q] |= v << s;
  if (s && s + n > 64) w[q + 1] |= v >> (64 - s);
}

// Exchanges the bits selected by mask with the bits d positions above them.
JAXHC_HD uint64_t delta_swap(uint64_t x, int d, uint64_t mask) {
  uint64_t t = ((x >> d) ^ x) & mask;
  return x ^ t ^ (t << d);
}

// Bit j of row i (bits 16i..16i+15) moves to bit 4j + i: a 4x16 bit matrix transposed, i.e. the six
// index bits rotated left by two, done as four index-bit swaps (2,0) (3,1) (4,0) (5,1).
JAXHC_HD uint64_t transpose_4x16(uint64_t m) {
  m = delta_swap(m, 3, 0x0a0a0a0a0a0a0a0aull);
  m = delta_swap(m, 6, 0x00cc00cc00cc00ccull);
  m = delta_swap(m, 15, 0x0000aaaa0000aaaaull);
  return delta_swap(m, 30, 0x00000000ccccccccull);
}

JAXHC_HD uint64_t transpose_16x4(uint64_t m) {  // the inverse: the same swaps in reverse order
  m = delta_swap(m, 30, 0x00000000ccccccccull);
  m = delta_swap(m, 15, 0x0000aaaa0000aaaaull);
  m = delta_swap(m, 6, 0x00cc00cc00cc00ccull);
  return delta_swap(m, 3, 0x0a0a0a0a0a0a0a0aull);
}

JAXHC_HD uint64_t reverse_nibbles(uint64_t x) {
  x = bswap64(x);
  return ((x >> 4) & 0x0f0f0f0f0f0f0f0full) | ((x & 0x0f0f0f0f0f0f0f0full) << 4);
}

// The 16 bit planes k, k-1, ..., k-15 of the four coefficients as they follow each other in the
// stream when sent verbatim: nibble j holds plane k - j, coefficient i in bit i of the nibble.
// Planes below 0 read as zero.
template <typename UInt>
JAXHC_HD uint64_t plane_window(const UInt* u, int k) {
  constexpr int prec = 8 * sizeof(UInt);
  uint64_t m = 0;
  for (int i = 0; i < 4; i++)
    m |= static_cast<uint64_t>(static_cast<UInt>(u[i] << (prec - 1 - k)) >> (prec - 16))
         << (16 * i);
  return reverse_nibbles(transpose_4x16(m));
}

// The inverse of plane_window: ORs the planes held in w into the coefficients.
template <typename UInt>
JAXHC_HD void deposit_window(UInt* u, int k, uint64_t w) {
  constexpr int prec = 8 * sizeof(UInt);
  uint64_t m = transpose_16x4(reverse_nibbles(w));
  for (int i = 0; i < 4; i++)
    u[i] |= static_cast<UInt>(static_cast<UInt>((m >> (16 * i)) & 0xffff) << (prec - 16)) >>
            (prec - 1 - k);
}

// The code of one bit plane x (bit i = coefficient i) when the first n coefficients are already
// significant: their n bits verbatim, then for the rest a group test (any one-bit left?) and, if
// so, a unary scan to the next one-bit (the last position's one-bit is implied), repeated.
struct Plane {
  uint32_t bits;  // the code (encode_plane), or the decoded plane x (decode_plane)
  int len;  // code length
  int n;    // significant coefficients after this plane
};

JAXHC_HD constexpr Plane encode_plane(int n, uint32_t x) {
  Plane p{x & ((1u << n) - 1), n, n};
  x >>= n;
  while (p.n < 4) {
    if (!x) {  // negative group test: the rest of the plane is zero
      p.len++;
      break;
    }
    p.bits |= 1u << p.len++;
    for (; p.n < 3; x >>= 1, p.n++) {
      bool one = x & 1;
      p.bits |= static_cast<uint32_t>(one) << p.len++;
      if (one) break;
    }
    x >>= 1;
    p.n++;
  }
  return p;
}

// Decodes one plane from the stream bits s with budget bits left, stopping where zfp stops when
// the budget runs out mid-plane (then the scanned position is taken as the one-bit).
JAXHC_HD constexpr Plane decode_plane(int n, uint64_t s, int budget) {
  int m = n < budget ? n : budget;
  Plane p{static_cast<uint32_t>(s & ((1u << m) - 1)), m, n};
  budget -= m;
  while (budget && p.n < 4) {
    budget--;
    if (!((s >> p.len++) & 1)) break;  // negative group test
    for (; budget && p.n < 3; p.n++) {
      budget--;
      if ((s >> p.len++) & 1) break;
    }
    p.bits |= 1u << p.n++;
  }
  return p;
}

// Codes are at most 7 bits long (n = 0, x = 15); the CPU build looks them up in tables built from
// the functions above. The CUDA build computes them (no host tables in device code); defining
// JAXHC_ZFP_NO_TABLES makes a host build do the same, to test that path.
constexpr int kMaxPlaneCode = 7;

#if defined(__CUDACC__) || defined(JAXHC_ZFP_NO_TABLES)
#define JAXHC_ZFP_PLANE_TABLES 0
#else
#define JAXHC_ZFP_PLANE_TABLES 1
#endif

#if JAXHC_ZFP_PLANE_TABLES
struct PlaneTables {
  uint16_t enc[4 * 16];              // [n][x] -> bits | len << 8 | n' << 12
  uint16_t dec[4 << kMaxPlaneCode];  // [n][next 7 stream bits] -> x | len << 4 | n' << 8
};

constexpr PlaneTables make_plane_tables() {
  PlaneTables t{};
  for (int n = 0; n < 4; n++) {
    for (uint32_t x = 0; x < 16; x++) {
      Plane p = encode_plane(n, x);
      t.enc[n * 16 + x] = static_cast<uint16_t>(p.bits | p.len << 8 | p.n << 12);
    }
    for (uint32_t s = 0; s < (1u << kMaxPlaneCode); s++) {
      Plane p = decode_plane(n, s, kMaxPlaneCode);
      t.dec[(n << kMaxPlaneCode) + s] = static_cast<uint16_t>(p.bits | p.len << 4 | p.n << 8);
    }
  }
  return t;
}

inline constexpr PlaneTables kPlaneTables = make_plane_tables();
#endif

JAXHC_HD Plane plane_code(int n, uint32_t x) {
#if !JAXHC_ZFP_PLANE_TABLES
  return encode_plane(n, x);
#else
  uint32_t e = kPlaneTables.enc[n * 16 + x];
  return Plane{e & 0xff, static_cast<int>((e >> 8) & 0xf), static_cast<int>(e >> 12)};
#endif
}

// s: the next min(kMaxPlaneCode, budget) stream bits.
JAXHC_HD Plane plane_read(int n, uint32_t s, int budget) {
#if JAXHC_ZFP_PLANE_TABLES
  uint32_t d = kPlaneTables.dec[(n << kMaxPlaneCode) + s];
  int len = (d >> 4) & 0xf;
  if (len <= budget) return Plane{d & 0xf, len, static_cast<int>(d >> 8)};
#endif
  return decode_plane(n, s, budget);  // a plane cut short by the budget (or the CUDA build)
}

// Planes k, k-1, ... that follow while n coefficients are significant and no other one gets a
// one-bit form a run: each codes as its n bits verbatim and a 0 group-test bit (or, once n == 4,
// its 4 bits alone), so a run is the low n + 1 bits of each nibble of plane_window, packed.
// compact/expand convert between nibbles and fields of f = 1..4 bits in four halving steps.
JAXHC_HD constexpr uint64_t lane_mask(int f, int s) {
  uint64_t field = (uint64_t{1} << (f << s)) - 1, m = 0;
  for (int p = 0; p < 64; p += 8 << s) m |= field << p;
  return m;
}
template <int F>
JAXHC_HD uint64_t compact_fields(uint64_t w) {
  constexpr uint64_t m0 = lane_mask(F, 0), m1 = lane_mask(F, 1), m2 = lane_mask(F, 2),
                     m3 = lane_mask(F, 3);
  w = (w & m0) | ((w >> (4 - F)) & (m0 << F));
  w = (w & m1) | ((w >> (2 * (4 - F))) & (m1 << (2 * F)));
  w = (w & m2) | ((w >> (4 * (4 - F))) & (m2 << (4 * F)));
  return (w & m3) | ((w >> (8 * (4 - F))) & (m3 << (8 * F)));
}
template <int F>
JAXHC_HD uint64_t expand_fields(uint64_t w) {
  constexpr uint64_t m0 = lane_mask(F, 0), m1 = lane_mask(F, 1), m2 = lane_mask(F, 2),
                     m3 = lane_mask(F, 3);
  w = (w & m3) | ((w & (m3 << (8 * F))) << (8 * (4 - F)));
  w = (w & m2) | ((w & (m2 << (4 * F))) << (4 * (4 - F)));
  w = (w & m1) | ((w & (m1 << (2 * F))) << (2 * (4 - F)));
  return (w & m0) | ((w & (m0 << F)) << (4 - F));
}
JAXHC_HD uint64_t compact(uint64_t w, int f) {
  return f == 1 ? compact_fields<1>(w)
         : f == 2 ? compact_fields<2>(w)
         : f == 3 ? compact_fields<3>(w)
                  : w;
}
JAXHC_HD uint64_t expand(uint64_t w, int f) {
  return f == 1 ? expand_fields<1>(w)
         : f == 2 ? expand_fields<2>(w)
         : f == 3 ? expand_fields<3>(w)
                  : w;
}

// The bit permutations of the plane coder as a policy: this portable one for host and device;
// the CPU handlers substitute BMI2 pdep/pext where the CPU has fast ones (same results).
struct PortableBits {
  template <typename UInt>
  static JAXHC_HD uint64_t window(const UInt* u, int k) { return plane_window(u, k); }
  template <typename UInt>
  static JAXHC_HD void deposit(UInt* u, int k, uint64_t w) { deposit_window(u, k, w); }
  static JAXHC_HD uint64_t compact(uint64_t w, int f) { return detail::compact(w, f); }
  static JAXHC_HD uint64_t expand(uint64_t w, int f) { return detail::expand(w, f); }
  // The 32 bits of c with a second 1 after each one-bit (32 + popcount(c) bits; 2-D/3-D planes).
  static JAXHC_HD uint64_t double_ones(uint32_t c) {
    uint64_t y = c;
    for (uint32_t r = c; r; r &= r - 1) {  // from the lowest one-bit: the bits above move up
      int i = 31 - clz32(r & (0u - r));
      int at = i + popcount32(c & ((1u << i) - 1));  // where bit i sits now
      uint64_t low = (uint64_t{2} << at) - 1;
      y = (y & low) | ((y & ~low) << 1) | (uint64_t{2} << at);
    }
    return y;
  }
};

// Bit-plane coding of the negabinary coefficients u (zfp's encode_few_ints), at most end bits
// appended to out; returns how many. The planes alternate between an event (coefficient n or a
// later one has its top one-bit in the plane: coded through the tables) and the run up to the next
// event (sent in bulk from a 16-plane window). The first nonzero plane is an event.
template <typename Bits, typename UInt, typename Sink>
JAXHC_HD int encode_ints(const UInt* u, int maxprec, Sink& out, int end) {
  constexpr int prec = 8 * sizeof(UInt);
  const int kmin = prec > maxprec ? prec - maxprec : 0;
  UInt rest[5];  // rest[n]: one-bits of the coefficients n and later
  rest[4] = 0;
  for (int i = 3; i >= 0; i--) rest[i] = rest[i + 1] | u[i];
  int k = rest[0] ? prec - 1 - clz(rest[0]) : -1;  // planes above k are zero: one 0 bit each
  if (k < kmin) return 0;
  int pos = min_int(prec - 1 - k, end), n = 0, base = k;
  out.put(0, pos);
  uint64_t w = Bits::window(u, base);
  while (pos < end) {
    if (base - k >= 16) w = Bits::window(u, base = k);
    Plane p = plane_code(n, static_cast<uint32_t>(w >> (4 * (base - k))) & 0xf);
    int nb = min_int(p.len, end - pos);  // a code cut by the budget is its prefix: its low bits
    out.put(low_bits(p.bits, nb), nb);
    pos += nb;
    n = p.n;
    if (--k < kmin) break;
    UInt r = rest[n] & (~UInt(0) >> (prec - 1 - k));
    int event = r ? prec - 1 - clz(r) : -1, f = n < 4 ? n + 1 : 4;
    if (event < kmin) event = kmin - 1;
    while (k > event && pos < end) {
      if (base - k >= 16) w = Bits::window(u, base = k);
      int cnt = min_int(k - event, 16 - (base - k));
      nb = min_int(f * cnt, end - pos);  // so is a cut run
      out.put(low_bits(Bits::compact(w >> (4 * (base - k)), f), nb), nb);
      pos += nb;
      k -= cnt;
    }
    if (k < kmin) break;
  }
  return pos;
}

// The inverse of encode_ints (zfp's decode_few_ints); u must be zero on entry. A run ends at the
// first group-test bit that is set (bits past the budget read as 0: no group test, zero-extended
// planes). Decoded planes gather in a 16-plane window deposited into u when full.
template <typename Bits, typename UInt>
JAXHC_HD void decode_ints(const uint64_t* in, int maxprec, UInt* u, int pos, int end) {
  constexpr int prec = 8 * sizeof(UInt);
  const int kmin = prec > maxprec ? prec - maxprec : 0;
  if (pos >= end) return;
  uint64_t head = get_bits(in, pos, min_int(64, end - pos));
  if (!head) return;  // zero planes to the end of the budget (or of all 64 planes)
  int zero = ctz64(head);
  if (zero >= prec - kmin) return;
  pos += zero;
  int k = prec - 1 - zero, n = 0, base = k;
  uint64_t w = 0;
  bool more = true;
  while (more) {
    if (base - k >= 16) Bits::deposit(u, base, w), base = k, w = 0;
    int budget = end - pos;
    uint32_t s = static_cast<uint32_t>(get_bits(in, pos, min_int(kMaxPlaneCode, budget)));
    Plane p = plane_read(n, s, budget);
    w |= static_cast<uint64_t>(p.bits) << (4 * (base - k));
    pos += p.len;
    n = p.n;
    more = --k >= kmin && pos < end;
    for (int f = n < 4 ? n + 1 : 4; more;) {  // the run, a window at a time, up to an event
      if (base - k >= 16) Bits::deposit(u, base, w), base = k, w = 0;
      int o = base - k, cnt = min_int(16 - o, k - kmin + 1);
      uint64_t run = Bits::expand(get_bits(in, pos, min_int(64, end - pos)), f) &
                     low_bits(~uint64_t{0}, 4 * cnt);
      uint64_t tests = n < 4 ? run & (0x1111111111111111ull << n) : 0;
      int j = tests ? ctz64(tests) >> 2 : cnt;
      w |= (run & low_bits(~uint64_t{0}, 4 * j)) << (4 * o);
      pos += f * j;
      k -= j;
      more = k >= kmin && pos < end;
      if (j < cnt) break;  // plane k is an event
    }
  }
  Bits::deposit(u, base, w);
}

}  // namespace detail
}  // namespace zfp
}  // namespace jaxhc
