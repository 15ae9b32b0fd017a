// The CPU block-quantization kernels (cpu/quant_kernels.h): the arithmetic of core/quant.h, one
// block at a time, vectorized with AVX2 + F16C (picked at run time; bfloat16/float16 widened and
// narrowed in the vectors) and a scalar tail that rounds the same way (stochastic rounding: the
// scalar code only). Blocks are independent,
// so rows split over threads at block bounds give the same bytes for any thread count. Compiled
// with -ffp-contract=off: every product is rounded before it is added, as the unfused
// decode-then-sum does.
#include "cpu/quant_kernels.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "core/quant.h"
#include "cpu/fp_mode.h"
#include "cpu/memory.h"
#include "cpu/parallel.h"
#include "cpu/quant_avx2.h"
#include "cpu/quant_rows.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace jaxhc {
namespace quant {
namespace {

template <typename T>
using E = Elems<T>;

// --- AVX2 (with F16C): whole chunks of 32 (encode) or 8 (decode) values; the caller does the
// rest with the scalar code, which rounds the same way.
#if defined(__x86_64__)
template <typename T>
JAXHC_QUANT_AVX2 uint32_t amax_avx2(const T* x, uint64_t m, uint64_t* done) {
  const __m256i mask = _mm256_set1_epi32(0x7fffffff);
  __m256i a = _mm256_setzero_si256();
  uint64_t i = 0;
  for (; i + 8 <= m; i += 8)
    a = _mm256_max_epu32(a, _mm256_and_si256(_mm256_castps_si256(load8(x + i)), mask));
  __m128i h = _mm_max_epu32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
  h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4e));
  h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xb1));
  *done = i;
  return static_cast<uint32_t>(_mm_cvtsi128_si32(h));
}

template <typename T>
JAXHC_QUANT_AVX2 __m256i codes32_avx2(const T* x, __m256 inv) {
  __m256i q[4];
  for (int j = 0; j < 4; j++) {
    __m256 y = _mm256_mul_ps(load8(x + 8 * j), inv);
    y = _mm256_round_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q[j] = _mm256_cvttps_epi32(y);
  }
  __m256i w = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  return _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

template <typename T>
JAXHC_QUANT_AVX2 uint64_t encode_avx2(const T* x, uint64_t m, float inv, int bits,
                                      uint8_t* codes) {
  const __m256 v = _mm256_set1_ps(inv);
  uint64_t i = 0;
  for (; i + 32 <= m; i += 32) {
    __m256i b = codes32_avx2(x + i, v);  // 32 int8 codes in order
    if (bits == 8) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + i), b);
    } else {  // byte pairs (lo, hi) -> lo & 15 | hi << 4
      __m256i w = _mm256_or_si256(
          _mm256_and_si256(b, _mm256_set1_epi16(0x000f)),
          _mm256_and_si256(_mm256_srli_epi16(b, 4), _mm256_set1_epi16(0x00f0)));
      __m128i p = _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i / 2), p);
    }
  }
  return i;
}

// 8 codes from value i on, as float32.
JAXHC_QUANT_AVX2 inline __m256 codes8_avx2(const uint8_t* codes, uint64_t i, int bits) {
  __m128i b;
  if (bits == 8) {
    b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i));
  } else {
    uint32_t four;
    std::memcpy(&four, codes + i / 2, 4);
    __m128i u = _mm_cvtepu8_epi16(_mm_cvtsi32_si128(static_cast<int>(four)));
    u = _mm_or_si128(_mm_and_si128(u, _mm_set1_epi16(0x000f)),
                     _mm_and_si128(_mm_slli_epi16(u, 4), _mm_set1_epi16(0x0f00)));
    b = _mm_sub_epi8(_mm_xor_si128(u, _mm_set1_epi8(8)), _mm_set1_epi8(8));  // sign-extend nibbles
  }
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
}

// acc[i] = code i * scale rounded to T (add: acc[i] += it), for whole chunks of 8; returns the
// values done.
template <typename T>
JAXHC_QUANT_AVX2 uint64_t decode_avx2(const uint8_t* codes, uint64_t m, float scale, int bits,
                                      float* acc, bool add) {
  const __m256 s = _mm256_set1_ps(scale);
  uint64_t i = 0;
  for (; i + 8 <= m; i += 8) {
    __m256 v = round8(_mm256_mul_ps(codes8_avx2(codes, i, bits), s), static_cast<T*>(nullptr));
    if (add) v = _mm256_add_ps(_mm256_loadu_ps(acc + i), v);
    _mm256_storeu_ps(acc + i, v);
  }
  return i;
}

#endif

// --- one block (values [0, m) of x, codes of the block at `codes`), any element type ---------

// `first`: the index of the block's first value in its row (stochastic rounding's draws).
template <typename T>
bool encode_block(Kernel k, const T* x, uint64_t m, int bits, Rounding rnd, uint64_t first,
                  float* scale, uint8_t* codes) {
  uint32_t a = 0;
  uint64_t i = 0;
#if defined(__x86_64__)
  if (k != Kernel::kPortable) a = amax_avx2(x, m, &i);
#endif
  for (; i < m; i++) a = std::max(a, abs_bits(E<T>::widen(x[i])));
  const Scale s = scale_of(a, bits);
  *scale = s.scale;
  if (s.inv == 0.0f) {  // zero block (tiny or not finite): no product with an Inf/NaN
    std::memset(codes, 0, code_bytes(m, bits));
    return a < kInfBits;
  }
  i = 0;
#if defined(__x86_64__)
  if (k != Kernel::kPortable && !rnd.stochastic) i = encode_avx2(x, m, s.inv, bits, codes);
#endif
  const int qm = qmax(bits);
  auto q = [&](uint64_t j) {
    if (j >= m) return 0;
    const float v = E<T>::widen(x[j]);
    if (!rnd.stochastic) return quantize(v, s.inv);
    return quantize_sr(v, s.inv, qm, sr_draw(rnd.seed, first + j, bits_of(v)));
  };
  const uint64_t step = bits == 8 ? 1 : 2;
  for (; i < m; i += step) codes[i * bits / 8] = code_byte(q(i), q(i + 1), bits);
  return true;
}

// Values of one block, rounded to T; with `add`, out holds the running sums of the earlier parts
// (in float32) and gets this part's values added; `last` rounds the sums to T.
template <typename T>
void decode_block(Kernel k, const uint8_t* codes, uint64_t m, int bits, float scale, float* acc,
                  bool add) {
  uint64_t i = 0;
#if defined(__x86_64__)
  if (k != Kernel::kPortable) i = decode_avx2<T>(codes, m, scale, bits, acc, add);
#endif
  for (; i < m; i++) {
    float v = E<T>::widen(E<T>::narrow(dequantize(code_at(codes, i, bits), scale)));
    acc[i] = add ? acc[i] + v : v;
  }
}

constexpr size_t kBuf = 4096;  // float32 sums per stack buffer

template <typename T>
void encode_rows_t(Kernel k, const T* x, uint64_t rows, const Row& r, Rounding rnd,
                   uint8_t* payload, bool* ok) {
  prefer_huge_pages(payload, rows * r.bytes);
  for (uint64_t i = 0; i < rows; i++) ok[i] = true;
  for_blocks(rows, r, [&](uint64_t row, uint64_t kb) {
    uint8_t* p = payload + row * r.bytes;
    uint8_t* codes = r.codes(p);
    float* scales = reinterpret_cast<float*>(p);
    if (!encode_block(k, x + row * r.n + kb * r.block, r.size(kb), r.bits, rnd, kb * r.block,
                      scales + kb, codes + r.code_offset(kb)))
      __atomic_store_n(&ok[row], false, __ATOMIC_RELAXED);
    if (kb + 1 == r.blocks) {
      const uint64_t used = r.used(false);
      std::memset(p + used, 0, r.bytes - used);
    }
  });
}

// out row = sum over parts of the decoded rows (parts = 1: decode).
template <typename T>
void decode_sum_rows_t(Kernel k, const uint8_t* payload, int parts, uint64_t rows, const Row& r,
                       T* x) {
  prefer_huge_pages(x, rows * r.n * sizeof(T));
  for_blocks(rows, r, [&](uint64_t row, uint64_t kb) {
    float buf[std::is_same_v<T, float> ? 1 : kBuf];
    const uint64_t m = r.size(kb);
    T* out = x + row * r.n + kb * r.block;
    for (uint64_t c0 = 0; c0 < m; c0 += kBuf) {  // kBuf is a multiple of 8: byte-aligned codes
      const uint64_t c = std::min<uint64_t>(kBuf, m - c0);
      float* acc = buf;  // float32 rows sum in place, the others in float32 beside
      if constexpr (std::is_same_v<T, float>) acc = out + c0;
      for (int part = 0; part < parts; part++) {
        const uint8_t* p = payload + (row * parts + part) * r.bytes;
        const float scale = reinterpret_cast<const float*>(p)[kb];
        const uint8_t* codes = r.codes(p) + r.code_offset(kb) + c0 * r.bits / 8;
        decode_block<T>(k, codes, c, r.bits, scale, acc, part > 0);
      }
      if constexpr (!std::is_same_v<T, float>) {
        uint64_t i = 0;
#if defined(__x86_64__)
        if (k != Kernel::kPortable) i = narrow_avx2(acc, c, out + c0);
#endif
        for (; i < c; i++) out[c0 + i] = E<T>::narrow(acc[i]);
      }
    }
  });
}

}  // namespace

const char* kernel_name(Kernel k) {
  return k == Kernel::kAvx512 ? "avx512" : k == Kernel::kAvx2 ? "avx2" : "portable";
}

bool kernel_supported(Kernel k) {
  return k == Kernel::kPortable || (k == Kernel::kAvx2 ? avx2_supported() : avx512_supported());
}

Kernel active_kernel() {
  const char* env = std::getenv("JAXHC_QUANT_KERNEL");
  const std::string name = env ? env : "";
  if (name.empty() || name == "auto")
    return avx512_supported() ? Kernel::kAvx512
                              : avx2_supported() ? Kernel::kAvx2 : Kernel::kPortable;
  if (name == "portable") return Kernel::kPortable;
  if (name == "avx2") {
    if (avx2_supported()) return Kernel::kAvx2;
    throw std::invalid_argument("JAXHC_QUANT_KERNEL=avx2: this CPU has no AVX2 with F16C");
  }
  if (name == "avx512") {
    if (avx512_supported()) return Kernel::kAvx512;
    throw std::invalid_argument(
        "JAXHC_QUANT_KERNEL=avx512: this CPU has no AVX-512 F/BW/DQ/VL/VBMI with AVX2 and F16C");
  }
  throw std::invalid_argument("JAXHC_QUANT_KERNEL=" + name +
                              " is not one of auto, avx512, avx2, portable");
}

void encode_rows(Kernel k, const void* x, Elem type, uint64_t rows, uint64_t n, int bits,
                 uint64_t block, Rounding rnd, uint8_t* payload, bool* ok) {
  const Row r(n, bits, block, false);
  with_elem(type, [&](auto t) {
    using T = decltype(t);
    encode_rows_t(k, static_cast<const T*>(x), rows, r, rnd, payload, ok);
  });
}

void decode_sum_rows(Kernel k, const uint8_t* payload, int parts, Elem type, uint64_t rows,
                     uint64_t n, int bits, uint64_t block, void* x) {
  const Row r(n, bits, block, false);
  with_elem(type, [&](auto t) {
    using T = decltype(t);
    decode_sum_rows_t(k, payload, parts, rows, r, static_cast<T*>(x));
  });
}

}  // namespace quant
}  // namespace jaxhc
