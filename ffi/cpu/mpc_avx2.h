// AVX2 data movements of the MPC chunk pipeline for 32-bit and 16-bit words (core/mpc_chunk.h):
// the same results as SerialTeam's loops, with the rows <-> words layout changes done as 8 x 8
// (32-bit) or 16 x 16 (16-bit) word transposes and the compaction / expansion of stored words
// through shuffle tables (8 words a step instead of one). Only full chunks take them; a partial
// last chunk takes the plain loops.
// Included by cpu/mpc_cpu.cc only, whose callers are compiled for x86-64-v3 (AVX2, BMI2).
#pragma once
#include <immintrin.h>

#include "core/mpc_chunk.h"

#define JAXHC_AVX2 inline __attribute__((target("avx2,bmi2,popcnt"), always_inline))
// The team's methods are called from the generic pipeline, compiled for any target: plain calls.
#define JAXHC_AVX2_CALL __attribute__((target("avx2,bmi2,popcnt")))

namespace jaxhc {
namespace mpc {

// vpermd indices: compress[mask] brings the lanes whose mask bit is set to the front, in order;
// expand[mask] sends the front lanes to the lanes whose bit is set.
struct Shuffles {
  alignas(32) uint32_t compress[256][8];
  alignas(32) uint32_t expand[256][8];
  Shuffles() {
    for (int mask = 0; mask < 256; ++mask) {
      int n = 0;
      for (int lane = 0; lane < 8; ++lane) {
        compress[mask][lane] = expand[mask][lane] = 0;
        if (mask >> lane & 1) {
          compress[mask][n] = uint32_t(lane);
          expand[mask][lane] = uint32_t(n++);
        }
      }
    }
  }
};

inline const Shuffles& shuffles() {
  static const Shuffles s;
  return s;
}

// Transposes the 8 x 8 words r[0..7] (row i = r[i]) in place.
JAXHC_AVX2 void transpose8(__m256i (&r)[8]) {
  __m256i t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x31);
  }
}

// w[j * 32 + k] = a[k][j] (a 64-byte aligned; w any alignment), and the inverse.
JAXHC_AVX2 void rows_to_words(const uint32_t (&a)[32][32], uint32_t* w) {
  for (int kb = 0; kb < 32; kb += 8)
    for (int jb = 0; jb < 32; jb += 8) {
      __m256i r[8];
      for (int u = 0; u < 8; ++u)
        r[u] = _mm256_load_si256(reinterpret_cast<const __m256i*>(&a[kb + u][jb]));
      transpose8(r);
      for (int t = 0; t < 8; ++t)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(w + (jb + t) * 32 + kb), r[t]);
    }
}
JAXHC_AVX2 void words_to_rows(const uint32_t* w, uint32_t (&a)[32][32]) {
  for (int jb = 0; jb < 32; jb += 8)
    for (int kb = 0; kb < 32; kb += 8) {
      __m256i r[8];
      for (int t = 0; t < 8; ++t)
        r[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + (jb + t) * 32 + kb));
      transpose8(r);
      for (int u = 0; u < 8; ++u)
        _mm256_store_si256(reinterpret_cast<__m256i*>(&a[kb + u][jb]), r[u]);
    }
}

// The serial team for 32-bit words with the AVX2 data movements; `words` is 1024 words of
// scratch (64-byte aligned).
struct Avx2Team32 : SerialTeam<uint32_t> {
  const Shuffles& tab;
  uint32_t* words;

  JAXHC_AVX2_CALL void delta_rows(Words<uint32_t> in, uint32_t m, uint32_t dim, Rows& a) const {
    if (m != kChunkWords) return SerialTeam::delta_rows(in, m, dim, a);
    const uint32_t* x = in.p;
    uint32_t i = 0;
    for (; i < dim; ++i) words[i] = x[i];
    for (; i + 8 <= kChunkWords; i += 8) {
      __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
      __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i - dim));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(words + i), _mm256_sub_epi32(v, p));
    }
    for (; i < kChunkWords; ++i) words[i] = x[i] - x[i - dim];
    words_to_rows(words, a);
  }

  // The stored words may be followed by up to 7 words of garbage (stage has room for them).
  JAXHC_AVX2_CALL void pack(const ChunkRows<uint32_t, 32>& r, uint32_t* packed) const {
    rows_to_words(r.a, words);
    uint32_t pos = 0;
    for (int g = 0; g < 128; ++g) {
      const uint32_t mask = r.nz[g >> 2] >> (8 * (g & 3)) & 0xFF;
      __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(words + 8 * g));
      __m256i idx = _mm256_load_si256(reinterpret_cast<const __m256i*>(tab.compress[mask]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(packed + pos),
                          _mm256_permutevar8x32_epi32(v, idx));
      pos += uint32_t(_mm_popcnt_u32(mask));
    }
  }

  // Reads up to 7 words past the stored ones (stage has room for them).
  JAXHC_AVX2_CALL void unpack(const uint32_t* stored, ChunkRows<uint32_t, 32>& r) const {
    const __m256i bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    uint32_t pos = 0;
    for (int g = 0; g < 128; ++g) {
      const uint32_t mask = r.nz[g >> 2] >> (8 * (g & 3)) & 0xFF;
      __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(stored + pos));
      __m256i idx = _mm256_load_si256(reinterpret_cast<const __m256i*>(tab.expand[mask]));
      __m256i keep = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(int(mask)), bits), bits);
      _mm256_store_si256(reinterpret_cast<__m256i*>(words + 8 * g),
                         _mm256_and_si256(_mm256_permutevar8x32_epi32(v, idx), keep));
      pos += uint32_t(_mm_popcnt_u32(mask));
    }
    words_to_rows(words, r.a);
  }

  JAXHC_AVX2_CALL void store_rows(const Rows& a, uint32_t* x, uint32_t m) const {
    if (m != kChunkWords) return SerialTeam::store_rows(a, x, m);
    rows_to_words(a, x);
  }
};

// --- 16-bit words (bfloat16, float16): 64 tiles of 16 words ------------------------------------

// pshufb indices for 8 16-bit words: compress[mask] brings the words whose mask bit is set to the
// front, in order, and zeros the rest; expand[mask] sends the front words to the words whose bit
// is set and zeros the others.
struct Shuffles16 {
  alignas(16) uint8_t compress[256][16];
  alignas(16) uint8_t expand[256][16];
  Shuffles16() {
    for (int mask = 0; mask < 256; ++mask) {
      for (int b = 0; b < 16; ++b) compress[mask][b] = expand[mask][b] = 0x80;
      int n = 0;
      for (int lane = 0; lane < 8; ++lane) {
        if (!(mask >> lane & 1)) continue;
        for (int b = 0; b < 2; ++b) {
          compress[mask][2 * n + b] = uint8_t(2 * lane + b);
          expand[mask][2 * lane + b] = uint8_t(2 * n + b);
        }
        ++n;
      }
    }
  }
};

inline const Shuffles16& shuffles16() {
  static const Shuffles16 s;
  return s;
}

// Transposes the 16 x 16 words r[0..15] (row i = r[i]) in place: 8 x 8 transposes of the rows
// 0-7 and 8-15 within each 128-bit half (unpacks of 16, 32 and 64 bits), then the halves swapped.
JAXHC_AVX2 void transpose16(__m256i (&r)[16]) {
  __m256i x[2][8];
  for (int h = 0; h < 2; ++h) {
    const __m256i* a = r + 8 * h;
    __m256i t[8], u[8];
    for (int i = 0; i < 4; ++i) {
      t[2 * i] = _mm256_unpacklo_epi16(a[2 * i], a[2 * i + 1]);
      t[2 * i + 1] = _mm256_unpackhi_epi16(a[2 * i], a[2 * i + 1]);
    }
    for (int i = 0; i < 2; ++i) {  // t[4i..4i+3] -> u[4i..4i+3]: columns 0-1, 2-3, 4-5, 6-7
      u[4 * i] = _mm256_unpacklo_epi32(t[4 * i], t[4 * i + 2]);
      u[4 * i + 1] = _mm256_unpackhi_epi32(t[4 * i], t[4 * i + 2]);
      u[4 * i + 2] = _mm256_unpacklo_epi32(t[4 * i + 1], t[4 * i + 3]);
      u[4 * i + 3] = _mm256_unpackhi_epi32(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int c = 0; c < 4; ++c) {  // column 2c and 2c + 1 of the 8 rows (and 8 + 2c, 9 + 2c)
      x[h][2 * c] = _mm256_unpacklo_epi64(u[c], u[c + 4]);
      x[h][2 * c + 1] = _mm256_unpackhi_epi64(u[c], u[c + 4]);
    }
  }
  for (int c = 0; c < 8; ++c) {
    r[c] = _mm256_permute2x128_si256(x[0][c], x[1][c], 0x20);
    r[c + 8] = _mm256_permute2x128_si256(x[0][c], x[1][c], 0x31);
  }
}

// w[j * 16 + k] = a[k][j] (a 64-byte aligned; w any alignment), and the inverse.
JAXHC_AVX2 void rows_to_words(const uint16_t (&a)[16][64], uint16_t* w) {
  for (int jb = 0; jb < 64; jb += 16) {
    __m256i r[16];
    for (int k = 0; k < 16; ++k)
      r[k] = _mm256_load_si256(reinterpret_cast<const __m256i*>(&a[k][jb]));
    transpose16(r);
    for (int t = 0; t < 16; ++t)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(w + (jb + t) * 16), r[t]);
  }
}
JAXHC_AVX2 void words_to_rows(const uint16_t* w, uint16_t (&a)[16][64]) {
  for (int jb = 0; jb < 64; jb += 16) {
    __m256i r[16];
    for (int t = 0; t < 16; ++t)
      r[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + (jb + t) * 16));
    transpose16(r);
    for (int k = 0; k < 16; ++k)
      _mm256_store_si256(reinterpret_cast<__m256i*>(&a[k][jb]), r[k]);
  }
}

// The serial team for 16-bit words with the AVX2 data movements; `words` is 1024 words of
// scratch (64-byte aligned).
struct Avx2Team16 : SerialTeam<uint16_t> {
  const Shuffles16& tab;
  uint16_t* words;

  JAXHC_AVX2_CALL void delta_rows(Words<uint16_t> in, uint32_t m, uint32_t dim, Rows& a) const {
    if (m != kChunkWords) return SerialTeam::delta_rows(in, m, dim, a);
    const uint16_t* x = in.p;
    uint32_t i = 0;
    for (; i < dim; ++i) words[i] = x[i];
    for (; i + 16 <= kChunkWords; i += 16) {
      __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
      __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i - dim));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(words + i), _mm256_sub_epi16(v, p));
    }
    for (; i < kChunkWords; ++i) words[i] = uint16_t(x[i] - x[i - dim]);
    words_to_rows(words, a);
  }

  // transpose_bits of the rows, 16 tiles at a time with their 16 rows in registers.
  JAXHC_AVX2_CALL void transpose(Rows& a) const {
    for (int jb = 0; jb < 64; jb += 16) {
      __m256i r[16];
      for (int k = 0; k < 16; ++k)
        r[k] = _mm256_load_si256(reinterpret_cast<const __m256i*>(&a[k][jb]));
      stage<8>(r, 0x00FF), stage<4>(r, 0x0F0F), stage<2>(r, 0x3333), stage<1>(r, 0x5555);
      for (int k = 0; k < 16; ++k)
        _mm256_store_si256(reinterpret_cast<__m256i*>(&a[k][jb]), r[k]);
    }
  }
  // One step of transpose_bits: rows k and k + S (k & S == 0) swap the bits at the positions p
  // with p & S == 0 of row k + S and the positions p + S of row k.
  template <int S>
  static JAXHC_AVX2 void stage(__m256i (&r)[16], int mask) {
    const __m256i m = _mm256_set1_epi16(short(mask));
    for (int k = 0; k < 16; ++k) {
      if (k & S) continue;
      __m256i t = _mm256_and_si256(_mm256_xor_si256(_mm256_srli_epi16(r[k], S), r[k + S]), m);
      r[k] = _mm256_xor_si256(r[k], _mm256_slli_epi16(t, S));
      r[k + S] = _mm256_xor_si256(r[k + S], t);
    }
  }

  // The stored words are followed by up to 7 zero words (stage has room for them), so the zero
  // padding after the last stored word is written too.
  JAXHC_AVX2_CALL void pack(const ChunkRows<uint16_t, 64>& r, uint16_t* packed) const {
    rows_to_words(r.a, words);
    uint32_t pos = 0;
    for (int g = 0; g < 128; ++g) {
      const uint32_t mask = uint32_t(r.nz[g >> 1]) >> (8 * (g & 1)) & 0xFF;
      __m128i v = _mm_load_si128(reinterpret_cast<const __m128i*>(words + 8 * g));
      __m128i idx = _mm_load_si128(reinterpret_cast<const __m128i*>(tab.compress[mask]));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(packed + pos), _mm_shuffle_epi8(v, idx));
      pos += uint32_t(_mm_popcnt_u32(mask));
    }
  }

  // Reads up to 7 words past the stored ones (stage has room for them).
  JAXHC_AVX2_CALL void unpack(const uint16_t* stored, ChunkRows<uint16_t, 64>& r) const {
    uint32_t pos = 0;
    for (int g = 0; g < 128; ++g) {
      const uint32_t mask = uint32_t(r.nz[g >> 1]) >> (8 * (g & 1)) & 0xFF;
      __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(stored + pos));
      __m128i idx = _mm_load_si128(reinterpret_cast<const __m128i*>(tab.expand[mask]));
      _mm_store_si128(reinterpret_cast<__m128i*>(words + 8 * g), _mm_shuffle_epi8(v, idx));
      pos += uint32_t(_mm_popcnt_u32(mask));
    }
    words_to_rows(words, r.a);
  }

  JAXHC_AVX2_CALL void store_rows(const Rows& a, uint16_t* x, uint32_t m) const {
    if (m != kChunkWords) return SerialTeam::store_rows(a, x, m);
    rows_to_words(a, x);
  }
};

}  // namespace mpc
}  // namespace jaxhc
