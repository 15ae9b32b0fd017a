// The CPU kernels of the rotated block quantizers q8:h / q4:h (format and arithmetic in
// core/quant_rotated.h): one block at a time on a stack copy, by a team of core/quant_rotated.h
// -- one value at a time (CpuScalar, the portable kernel), 8 AVX2 lanes (Avx2Team; F16C for
// float16; cpu/quant_rotated_avx2.h) or 16 AVX-512 lanes (Avx512Team, cpu/quant_rotated_avx512.h)
// -- that adds the team's memory moves (values in, codes out, levels in, values out).
// All run core's integer transform and give the same bytes. Blocks are independent, so any
// thread count gives the same bytes. Compiled with -ffp-contract=off.
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

// The largest |x| bits of x[0..m), m <= B, and (past m) the zeros of the padding.
template <typename T>
JAXHC_ROT_INLINE uint32_t amax_scalar(const T* x, uint64_t m) {
  uint32_t a = 0;
  for (uint64_t i = 0; i < m; i++) a = std::max(a, abs_bits(E<T>::widen(x[i])));
  return a;
}

// One value per row: core's rules as they are written.
struct CpuScalar : ScalarTeam {
  template <typename T, bool kFull>
  static JAXHC_ROT_INLINE uint32_t amax(const T* x, uint64_t m) {
    return amax_scalar(x, m);
  }
  template <typename T, bool kFull>
  static JAXHC_ROT_INLINE V load_fixed(const T* x, uint32_t i, uint64_t m, float factor) {
    return to_fixed(kFull || i < m ? E<T>::widen(x[i]) : 0.0f, factor, negated(i));
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
  // The 4-bit codes of rows y[0..4) from their indices under candidate c (idx[k][c]).
  static constexpr bool kIndexCodes = true;
  static JAXHC_ROT_INLINE void store_index_codes(const V* y, const V (*idx)[kScales], int c,
                                                 uint8_t* codes, uint32_t i) {
    int k[4];
    for (int j = 0; j < 4; j++) k[j] = signed_code(y[j], idx[j][c], 4);
    codes[i / 2] = static_cast<uint8_t>(k[0] | k[1] << 4);
    codes[i / 2 + 1] = static_cast<uint8_t>(k[2] | k[3] << 4);
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


}  // namespace
}  // namespace quant
}  // namespace jaxhc

#include "cpu/quant_rotated_avx2.h"    // Avx2Team, on the tables above
#include "cpu/quant_rotated_avx512.h"  // Avx512Team

namespace jaxhc {
namespace quant {
namespace {

// --- one block, any team -------------------------------------------------------------------------

// Encodes the block x[0..m) (m <= B) into *scale and B * bits / 8 code bytes; false: not ok.
template <class Tm, typename T, int B, int bits, bool kFull>
JAXHC_ROT_INLINE bool encode_block(const T* x, uint64_t m, float* scale, uint8_t* codes) {
  constexpr int R = B / Tm::kLanes;
  const uint32_t a = Tm::template amax<T, kFull>(x, m);
  if (a >= kHugeBits || a < kTinyRotBits) {  // not ok, or (nearly) all zeros
    *scale = 0.0f;
    std::memset(codes, 0, B * bits / 8);
    return a < kHugeBits;
  }
  const float factor = fixed_factor(a);
  typename Tm::V v[R];
  for (int r = 0; r < R; r++) v[r] = Tm::template load_fixed<T, kFull>(x, r * Tm::kLanes, m, factor);
  const double sigma = sqrt_rn(sum_squares<Tm, R>(v));
  fwht<Tm, R>(v);
  alignas(32) int32_t thr[128];
  if constexpr (bits == 4) {  // the scale choice keeps every row's indices: the codes' too
    typename Tm::V idx[R][kScales];
    int c = 0;
    const double gain = choose_scale<Tm, R>(v, sigma, kThresholds4, kLevels4, thr, idx, &c);
    *scale = block_scale(gain, log2_of(B), a);
    for (int r = 0; r < R; r += 4) {
      if constexpr (Tm::kIndexCodes)
        Tm::store_index_codes(v + r, idx + r, c, codes, r * Tm::kLanes);
      else
        Tm::template store_codes<bits>(v + r, thr, codes, r * Tm::kLanes);
    }
  } else {
    fixed_thresholds(thresholds_of(bits), bits, sigma, thr);
    *scale = block_scale(sigma, log2_of(B), a);
    for (int r = 0; r < R; r += 4) Tm::template store_codes<bits>(v + r, thr, codes, r * Tm::kLanes);
  }
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
    template <typename T, int B, int bits, bool kFull>                                     \
    ATTR static bool encode(const T* x, uint64_t m, float* s, uint8_t* c) {                \
      return encode_block<TEAM, T, B, bits, kFull>(x, m, s, c);                            \
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

// Calls fn(Blocks) with the block functions of kernel k.
template <typename Fn>
void with_kernel(Kernel k, Fn&& fn) {
#if defined(__x86_64__)
  if (k == Kernel::kAvx512) return fn(Avx512Blocks{});
  if (k == Kernel::kAvx2) return fn(Avx2Blocks{});
#endif
  (void)k;
  fn(ScalarBlocks{});
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
    const bool ok_block = m == B ? K::template encode<T, B, bits, true>(xb, m, scales + kb, codes)
                                 : K::template encode<T, B, bits, false>(xb, m, scales + kb, codes);
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

// Calls fn(blocks, T{}, IntTag<block>, IntTag<bits>) for kernel k's block functions.
template <typename Fn>
void dispatch(Kernel k, Elem type, uint64_t block, int bits, Fn&& fn) {
  with_kernel(k, [&](auto blocks) {
    with_elem(type, [&](auto t) {
      with_block(block, [&](auto b) { with_bits(bits, [&](auto q) { fn(blocks, t, b, q); }); });
    });
  });
}

}  // namespace

void encode_rotated_rows(Kernel k, const void* x, Elem type, uint64_t rows, uint64_t n, int bits,
                         uint64_t block, uint8_t* payload, bool* ok) {
  const Row r(n, bits, block, true);
  dispatch(k, type, block, bits, [&](auto blocks, auto t, auto b, auto q) {
    using T = decltype(t);
    encode_rows_t<T, decltype(blocks), decltype(b)::value, decltype(q)::value>(
        static_cast<const T*>(x), rows, r, payload, ok);
  });
}

void decode_sum_rotated_rows(Kernel k, const uint8_t* payload, int parts, Elem type,
                             uint64_t rows, uint64_t n, int bits, uint64_t block, void* x) {
  const Row r(n, bits, block, true);
  dispatch(k, type, block, bits, [&](auto blocks, auto t, auto b, auto q) {
    using T = decltype(t);
    decode_sum_rows_t<T, decltype(blocks), decltype(b)::value, decltype(q)::value>(
        payload, parts, rows, r, static_cast<T*>(x));
  });
}

void hadamard_rows(Kernel k, const int32_t* x, uint64_t n, uint64_t block, int32_t* y) {
  with_kernel(k, [&](auto blocks) {
    with_block(block, [&](auto b) {
      for (uint64_t i = 0; i < n; i += block)
        decltype(blocks)::template hadamard<decltype(b)::value>(x + i, y + i);
    });
  });
}

}  // namespace quant
}  // namespace jaxhc
