// AVX2 + F16C helpers of the CPU block-quantization kernels (cpu/quant_kernels.cc, plain q8/q4;
// cpu/quant_rotated.cc, q8:h/q4:h): loads that widen to float32 exactly, rounding to the element
// type as E<T>::narrow does, stores. Compiled with the target attribute, chosen at run time.
#pragma once
#include <cstdint>

#include "core/floats.h"

#if defined(__x86_64__)
// GCC 12 warns about _mm512_undefined_epi32 inside its own intrinsics (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

namespace jaxhc {
namespace quant {

// AVX2 with F16C on this CPU (checked once).
inline bool avx2_supported() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return yes;
#else
  return false;
#endif
}

// AVX-512 F, BW, DQ, VL and VBMI besides (the rotated codecs' avx512 kernel; checked once).
inline bool avx512_supported() {
#if defined(__x86_64__)
  static const bool yes = avx2_supported() && __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vbmi");
  return yes;
#else
  return false;
#endif
}

#if defined(__x86_64__)
#define JAXHC_QUANT_AVX2 __attribute__((target("avx2,f16c")))
#define JAXHC_QUANT_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vbmi,avx2,f16c")))

// 8 values from p, widened to float32 exactly.
JAXHC_QUANT_AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
JAXHC_QUANT_AVX2 inline __m256 load8(const Bf16* p) {
  __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}
JAXHC_QUANT_AVX2 inline __m256 load8(const F16* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// float32 values rounded to T (as E<T>::narrow: half to even), as float32 bit patterns of T's
// values (bf16: the upper halves; f16: the widened values). Inputs are finite: decoded products.
JAXHC_QUANT_AVX2 inline __m256i bf16_bits(__m256 v) {
  __m256i u = _mm256_castps_si256(v);
  __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  return _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd)),
                           16);
}
JAXHC_QUANT_AVX2 inline __m256 round8(__m256 v, float*) { return v; }
JAXHC_QUANT_AVX2 inline __m256 round8(__m256 v, Bf16*) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(bf16_bits(v), 16));
}
JAXHC_QUANT_AVX2 inline __m256 round8(__m256 v, F16*) {
  return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// Stores 8 float32 values already rounded to T (round8) as T.
JAXHC_QUANT_AVX2 inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
JAXHC_QUANT_AVX2 inline void store8(Bf16* p, __m256 v) {
  __m256i h = _mm256_srli_epi32(_mm256_castps_si256(v), 16);  // exact: already rounded
  __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), w);
}
JAXHC_QUANT_AVX2 inline void store8(F16* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
// out[i] = acc[i] rounded to T, for whole chunks of 8; returns the values done.
template <typename T>
JAXHC_QUANT_AVX2 uint64_t narrow_avx2(const float* acc, uint64_t m, T* out) {
  uint64_t i = 0;
  for (; i + 8 <= m; i += 8)
    store8(out + i, round8(_mm256_loadu_ps(acc + i), static_cast<T*>(nullptr)));
  return i;
}
#endif

}  // namespace quant
}  // namespace jaxhc
