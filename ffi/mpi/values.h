// The rank-order sum of the fused collectives, bit for bit as XLA:CPU computes it in jaxhc's
// unfused algorithms: bfloat16 <-> float32 as `astype` (core/floats.h), sums in float32 (float64
// for float64) with denormals flushed (XLA:CPU runs with FTZ and DAZ set, so the same adds here
// must too, whatever thread runs them).
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/floats.h"
#include "mpi/engine.h"

namespace jaxhc {
namespace mpi {

inline float widen(uint16_t bf16) {
  uint32_t u = bf16_to_f32(bf16);
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t narrow(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return f32_to_bf16(u);
}

// Sets FTZ and DAZ for its lifetime (x86-64; elsewhere a no-op).
class FlushDenormals {
 public:
#if defined(__x86_64__)
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }
  ~FlushDenormals() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
#endif
};

// dst[i] = ((v0[i] + v1[i]) + v2[i]) + ... over `parts` arrays of `count` values of type e,
// accumulated in float32 (float64 for kF64) and rounded to e once.
inline void sum_in_rank_order(const void* const* pieces, int parts, Elem e, uint64_t count,
                              void* dst) {
  FlushDenormals ftz;
  switch (e) {
    case Elem::kF32: {
      float* out = static_cast<float*>(dst);
      const float* first = static_cast<const float*>(pieces[0]);
      if (out != first) std::memcpy(out, first, count * 4);
      for (int p = 1; p < parts; ++p) {
        const float* v = static_cast<const float*>(pieces[p]);
        for (uint64_t i = 0; i < count; ++i) out[i] += v[i];
      }
      break;
    }
    case Elem::kF64: {
      double* out = static_cast<double*>(dst);
      const double* first = static_cast<const double*>(pieces[0]);
      if (out != first) std::memcpy(out, first, count * 8);
      for (int p = 1; p < parts; ++p) {
        const double* v = static_cast<const double*>(pieces[p]);
        for (uint64_t i = 0; i < count; ++i) out[i] += v[i];
      }
      break;
    }
    case Elem::kBF16: {
      constexpr uint64_t kTile = 2048;  // float32 accumulator tile on the stack
      float acc[kTile];
      uint16_t* out = static_cast<uint16_t*>(dst);
      for (uint64_t b = 0; b < count; b += kTile) {
        uint64_t c = count - b < kTile ? count - b : kTile;
        const uint16_t* v0 = static_cast<const uint16_t*>(pieces[0]) + b;
        for (uint64_t i = 0; i < c; ++i) acc[i] = widen(v0[i]);
        for (int p = 1; p < parts; ++p) {
          const uint16_t* v = static_cast<const uint16_t*>(pieces[p]) + b;
          for (uint64_t i = 0; i < c; ++i) acc[i] += widen(v[i]);
        }
        for (uint64_t i = 0; i < c; ++i) out[b + i] = narrow(acc[i]);
      }
      break;
    }
  }
}

}  // namespace mpi
}  // namespace jaxhc
