// The block-range loops of the ZFP kernels: the templates of cpu/zfp_blocks.h instantiated under
// one instruction set's function attributes (every call inlined but the group coders of the lane
// loops and the scalar fallbacks), behind type-erased pointers.
// The lane loops, the longest compiles, are instantiated in translation units of their own (one
// per instruction set and 1-D or 2-D/3-D rows: cpu/zfp_lanes_*.cc), so the build runs them in
// parallel; cpu/zfp_kernels.cc instantiates the scalar ones and picks one per call.
#pragma once
#include <cstdint>
#include <type_traits>

#include "cpu/zfp_avx2.h"
#include "cpu/zfp_avx512.h"
#include "cpu/zfp_blocks.h"
#include "cpu/zfp_kernels.h"

namespace jaxhc {
namespace zfp {

struct Loops {
  bool (*encode)(const void* x, uint64_t n, uint64_t b0, uint64_t b1, int maxbits, uint64_t* words);
  void (*decode)(const uint64_t* row, uint64_t nwords, uint64_t n, uint64_t b0, uint64_t b1,
                 int maxbits, void* x);
  void (*decode_sum)(const uint64_t* const* rows, int parts, uint64_t nwords, uint64_t n,
                     uint64_t b0, uint64_t b1, int maxbits, void* x);
};

// Defines struct NAME<Params...> whose encode/decode/decode_sum run the block loops ENC, DEC and
// SUM (templates of zfp_blocks.h, instantiated with ARGS) under function attributes ATTR.
#define JAXHC_ZFP_LOOPS(NAME, PARAMS, ATTR, ENC, DEC, SUM, ARGS)                              \
  template <PARAMS>                                                                           \
  struct NAME {                                                                               \
    ATTR static bool encode(const void* x, uint64_t n, uint64_t b0, uint64_t b1, int maxbits, \
                            uint64_t* words) {                                                \
      return cpu::ENC<ARGS>(static_cast<const cpu::T_<E>*>(x), n, b0, b1, maxbits, words);    \
    }                                                                                         \
    ATTR static void decode(const uint64_t* row, uint64_t nwords, uint64_t n, uint64_t b0,    \
                            uint64_t b1, int maxbits, void* x) {                              \
      cpu::DEC<ARGS>(row, nwords, n, b0, b1, maxbits, static_cast<cpu::T_<E>*>(x));           \
    }                                                                                         \
    ATTR static void decode_sum(const uint64_t* const* rows, int parts, uint64_t nwords,      \
                                uint64_t n, uint64_t b0, uint64_t b1, int maxbits, void* x) { \
      cpu::SUM<ARGS>(rows, parts, nwords, n, b0, b1, maxbits, static_cast<cpu::T_<E>*>(x));   \
    }                                                                                         \
    static constexpr Loops loops() { return {encode, decode, decode_sum}; }                   \
  };
#define JAXHC_COMMA ,

// clang-format off
JAXHC_ZFP_LOOPS(Portable, Elem E, , encode_scalar, decode_scalar, decode_sum_scalar,
                PortableBits JAXHC_COMMA E)
JAXHC_ZFP_LOOPS(Nd, int D JAXHC_COMMA Elem E, , encode_scalar, decode_scalar, decode_sum_scalar,
                PortableBits JAXHC_COMMA E JAXHC_COMMA D)
#if defined(__x86_64__)
#define JAXHC_BMI2 __attribute__((target("bmi,bmi2"), flatten))
#define JAXHC_AVX2 __attribute__((target("avx2,f16c,fma,bmi,bmi2"), flatten))
#define JAXHC_AVX512                                                                       \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vbmi,avx512vbmi2,gfni," \
                        "avx2,f16c,fma,bmi,bmi2"),                                        \
                 flatten))
// The group coders the lane loops call (cpu/zfp_blocks.h), under function attributes ATTR. The
// decoders are not inlined: each is compiled once per lane width W (1-D) or block layout D
// (2-D/3-D) and called by the loops of every element type, decode and decode_sum alike, per
// group of blocks; inlined into each loop, they were most of the compile time of the lane loops.
// The encoders, a small part of it, stay inlined: out of line, encoding measured 6-12 % slower
// (one thread, AVX2).
#define JAXHC_ZFP_KIT(NAME, ATTR)                                                               \
  template <class Lanes, class NdLanes, class BitsT>                                            \
  struct NAME {                                                                                 \
    using L = Lanes;                                                                            \
    using Nd = NdLanes;                                                                         \
    using Bits = BitsT;                                                                         \
    using V = typename L::V;                                                                    \
    template <int W>                                                                            \
    ATTR static bool encode(const V* f, int maxbits, V* out) {                                  \
      return lanes::Coder<L>::template encode<W>(f, maxbits, out);                              \
    }                                                                                           \
    template <int W>                                                                            \
    [[gnu::noinline]] ATTR static void decode(const uint64_t* row, uint64_t nwords, uint64_t b, \
                                              int maxbits, V* f) {                              \
      cpu::decode_group<L, Bits, W, 2>(row, nwords, b, maxbits, f);                             \
    }                                                                                           \
    template <int D>                                                                            \
    ATTR static bool encode_nd(const float (*v)[block_values(D)], int maxbits,                  \
                               cpu::WordWriter& out) {                                          \
      return cpu::encode_group_nd<Nd, Bits, D>(v, maxbits, out);                                \
    }                                                                                           \
    template <int D>                                                                            \
    [[gnu::noinline]] ATTR static void decode_nd(const uint64_t* row, uint64_t nwords,          \
                                                 uint64_t b, int maxbits,                       \
                                                 float (*v)[block_values(D)]) {                 \
      cpu::decode_group_nd<Nd, Bits, D>(row, nwords, b, maxbits, v);                            \
    }                                                                                           \
  };
JAXHC_ZFP_KIT(Avx2Kit, JAXHC_AVX2)
JAXHC_ZFP_KIT(Avx512Kit, JAXHC_AVX512)
using Avx2Groups = Avx2Kit<lanes::Pair<x86::Avx2>, x86::Avx2, PortableBits>;
using Avx512Groups = Avx512Kit<lanes::Pair<x86::Avx512>, x86::Avx512, x86::Bmi2Bits>;

JAXHC_ZFP_LOOPS(Bmi2, Elem E, JAXHC_BMI2, encode_scalar, decode_scalar, decode_sum_scalar,
                x86::Bmi2Bits JAXHC_COMMA E)
JAXHC_ZFP_LOOPS(NdAvx2, int D JAXHC_COMMA Elem E, JAXHC_AVX2, encode_scalar, decode_scalar,
                decode_sum_scalar, PortableBits JAXHC_COMMA E JAXHC_COMMA D)
// Zen 2 has AVX2 but microcoded pdep/pext: its lanes hand blocks to the portable scalar coder.
JAXHC_ZFP_LOOPS(Avx2, int W JAXHC_COMMA Elem E, JAXHC_AVX2, encode_lanes, decode_lanes,
                decode_sum_lanes,
                Avx2Groups JAXHC_COMMA W JAXHC_COMMA E)
JAXHC_ZFP_LOOPS(Avx512, int W JAXHC_COMMA Elem E, JAXHC_AVX512, encode_lanes, decode_lanes,
                decode_sum_lanes,
                Avx512Groups JAXHC_COMMA W JAXHC_COMMA E)
JAXHC_ZFP_LOOPS(NdLanesAvx2, int D JAXHC_COMMA Elem E, JAXHC_AVX2, encode_nd_lanes,
                decode_nd_lanes, decode_sum_nd_lanes,
                Avx2Groups JAXHC_COMMA D JAXHC_COMMA E)
JAXHC_ZFP_LOOPS(NdLanesAvx512, int D JAXHC_COMMA Elem E, JAXHC_AVX512, encode_nd_lanes,
                decode_nd_lanes, decode_sum_nd_lanes,
                Avx512Groups JAXHC_COMMA D JAXHC_COMMA E)
// clang-format on

// The lane loops of the rows `lane_rows` admits: 8 blocks at a time (avx2) or 16 (avx512); 1-D
// rows for `maxbits`, or rows of `dims` 2 or 3.
Loops avx2_lanes_1d(Elem type, int maxbits);
Loops avx2_lanes_nd(Elem type, int dims);
Loops avx512_lanes_1d(Elem type, int maxbits);
Loops avx512_lanes_nd(Elem type, int dims);
#endif

// Whether the lane coder takes rows of `type` coded at `maxbits` bits a block of `dims`: values
// it codes as float32 (not float64), and 16-bit ones (bfloat16, float16) in 1-D rows only up to
// 64 bits a block of 4, their own width; above it (a rate no one sends) the scalar coder codes
// them, the same bytes, and no lane loops are compiled for it.
constexpr bool lane_rows(Elem type, int maxbits, int dims) {
  return type != Elem::kF64 && (type == Elem::kF32 || dims != 1 || maxbits <= 64);
}

// The 1-D lane loops for `maxbits` (of rows `lane_rows` admits): the block's bits in 1, 2 or 4
// words of 32 bits per lane.
template <template <int, Elem> class Lanes, Elem E>
Loops lane_loops(int maxbits) {
  if (maxbits <= 32) return Lanes<1, E>::loops();
  if constexpr (E != Elem::kF32) {
    return Lanes<2, E>::loops();
  } else {
    if (maxbits <= 64) return Lanes<2, E>::loops();
    return Lanes<4, E>::loops();
  }
}

// f(std::integral_constant<Elem, E>{}) for the float32-coded element type `type` (not kF64).
template <class F>
Loops by_coded_type(Elem type, F&& f) {
  switch (type) {
    case Elem::kF32: return f(std::integral_constant<Elem, Elem::kF32>{});
    case Elem::kBF16: return f(std::integral_constant<Elem, Elem::kBF16>{});
    default: return f(std::integral_constant<Elem, Elem::kF16>{});
  }
}

}  // namespace zfp
}  // namespace jaxhc
