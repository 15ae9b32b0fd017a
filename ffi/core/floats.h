// The element types of the rows the codecs take, host and device code: float, double, and
// bfloat16/float16 bit patterns with their float32 conversions, rounding as jnp.astype does on
// XLA (round to nearest even; NaN quieted). Integer code only: no float arithmetic that a
// flush-to-zero mode could change, so subnormals convert exactly.
#pragma once
#include <cstring>

#include "core/common.h"

namespace jaxhc {

JAXHC_HD uint32_t bf16_to_f32(uint16_t h) { return static_cast<uint32_t>(h) << 16; }

JAXHC_HD uint32_t f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 0x1f) return sign | 0x7f800000 | (m << 13) | (m ? 0x400000 : 0);  // NaN quieted
  if (e) return sign | ((e + 112) << 23) | (m << 13);
  if (!m) return sign;
  int top = 31 - clz32(m);  // a subnormal m * 2^-24 is normal in float32
  return sign | (static_cast<uint32_t>(top + 103) << 23) | ((m << (23 - top)) & 0x7fffff);
}

JAXHC_HD uint16_t f32_to_bf16(uint32_t u) {
  if ((u & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>(((u >> 16) & 0x8000) | 0x7fc0);
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

JAXHC_HD uint16_t f32_to_f16(uint32_t u) {
  uint32_t sign = (u >> 16) & 0x8000, a = u & 0x7fffffff;
  if (a > 0x7f800000) return static_cast<uint16_t>(sign | 0x7e00 | ((a & 0x7fffff) >> 13));
  if (a >= 0x477ff000) return static_cast<uint16_t>(sign | 0x7c00);  // 65520 and up round to inf
  if (a >= 0x38800000) {                                             // normal float16
    uint32_t r = a + 0xfff + ((a >> 13) & 1);
    return static_cast<uint16_t>(sign | ((r >> 13) - (112u << 10)));
  }
  if (a < 0x33000000) return static_cast<uint16_t>(sign);  // below half the smallest subnormal
  uint32_t m = (a & 0x7fffff) | 0x800000;
  int sh = 126 - static_cast<int>(a >> 23);  // a = m * 2^-24 * 2^-sh in float16 subnormal units
  uint32_t q = m >> sh, rem = m & ((1u << sh) - 1), half = 1u << (sh - 1);
  q += rem > half || (rem == half && (q & 1));
  return static_cast<uint16_t>(sign | q);
}

struct Bf16 {
  uint16_t bits;
};
struct F16 {
  uint16_t bits;
};

// Elems<T>: Coded, the type a row of T is coded as, and the conversions to and from it.
template <typename T>
struct Elems {
  using Coded = T;
  static JAXHC_HD T widen(T v) { return v; }
  static JAXHC_HD T narrow(T v) { return v; }
};

JAXHC_HD float float_of(uint32_t u) {
  float v;
  memcpy(&v, &u, sizeof v);
  return v;
}

JAXHC_HD uint32_t bits_of(float v) {
  uint32_t u;
  memcpy(&u, &v, sizeof u);
  return u;
}

template <>
struct Elems<Bf16> {
  using Coded = float;
  static JAXHC_HD float widen(Bf16 h) { return float_of(bf16_to_f32(h.bits)); }
  static JAXHC_HD Bf16 narrow(float v) { return Bf16{f32_to_bf16(bits_of(v))}; }
};

template <>
struct Elems<F16> {
  using Coded = float;
  static JAXHC_HD float widen(F16 h) { return float_of(f16_to_f32(h.bits)); }
  static JAXHC_HD F16 narrow(float v) { return F16{f32_to_f16(bits_of(v))}; }
};

}  // namespace jaxhc
