// Shared by the CPU (g++) and CUDA (nvcc) builds of the codec cores.
#pragma once
#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define JAXHC_HD __host__ __device__ __forceinline__
#else
#define JAXHC_HD inline __attribute__((always_inline))
#endif

namespace jaxhc {

JAXHC_HD int clz32(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __clz(x);
#else
  return x ? __builtin_clz(x) : 32;
#endif
}

JAXHC_HD int clz64(uint64_t x) {
#if defined(__CUDA_ARCH__)
  return __clzll(x);
#else
  return x ? __builtin_clzll(x) : 64;
#endif
}

JAXHC_HD int popcount32(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __popc(x);
#else
  return __builtin_popcount(x);
#endif
}

JAXHC_HD int popcount64(uint64_t x) {
#if defined(__CUDA_ARCH__)
  return __popcll(x);
#else
  return __builtin_popcountll(x);
#endif
}

}  // namespace jaxhc
